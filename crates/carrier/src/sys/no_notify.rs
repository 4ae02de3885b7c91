//! Where file-change notifications are not built yet (everywhere but
//! Linux), the folder carrier polls: [`DirNotifier::watch_dir`] says so,
//! and nothing else here can be reached.

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::task::Context;

pub enum DirNotifier {}

pub struct Names {
    pub any: bool,
    pub overflowed: bool,
}

impl DirNotifier {
    pub fn watch_dir(_: &Path, _: &str) -> io::Result<DirNotifier> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "file-change notifications are built only for Linux so far",
        ))
    }

    pub fn follow(&mut self, _: &Path) {
        match *self {}
    }

    pub fn register(&self, _: &mio::Registry, _: mio::Token) -> io::Result<()> {
        match *self {}
    }

    pub fn drain(&mut self, _: &mut [u8]) -> bool {
        match *self {}
    }

    pub fn read_names(&mut self, _: &mut [u8], _: &mut dyn FnMut(&OsStr)) -> Names {
        match *self {}
    }

    pub fn hand_to_runtime(&mut self) -> io::Result<()> {
        match *self {}
    }

    pub fn poll_ours(&mut self, _: &mut Context<'_>) -> io::Result<bool> {
        match *self {}
    }
}
