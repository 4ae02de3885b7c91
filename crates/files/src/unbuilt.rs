//! Where the file service is not built yet (macOS, the BSDs): the
//! server refuses `--files` and the client `cp`, each in one line.

use std::io;

/// What a user who asks for the file service here is told.
pub const NOT_BUILT: &str =
    "the file service (cp, --files) is not built for this system yet: it runs on Linux and Windows";

/// Open files are not a per-process limit here.
pub fn open_files_limit() -> Option<u64> {
    None
}

pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    Err(io::ErrorKind::Unsupported.into())
}

pub mod serve {
    use std::convert::Infallible;
    use std::io;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use longhaul_session::logs::Refusals;
    use longhaul_session::LocalStream;

    use crate::Access;

    /// Never made: [`FileServer::open`] says why.
    #[derive(Debug)]
    pub struct FileServer(Infallible);

    impl FileServer {
        pub fn open(_: &Path) -> io::Result<Arc<FileServer>> {
            Err(io::Error::new(io::ErrorKind::Unsupported, super::NOT_BUILT))
        }

        pub fn sweep_partial_every_hour(self: &Arc<Self>, _: Duration) {
            match self.0 {}
        }

        pub fn path(&self) -> &Path {
            match self.0 {}
        }

        pub fn accept(
            self: &Arc<Self>,
            _: Access,
            _: Arc<Refusals>,
        ) -> Result<LocalStream, String> {
            match self.0 {}
        }
    }
}
