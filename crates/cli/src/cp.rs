//! `longhaul cp`: wires a client session to the file copy.

use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;
use longhaul_files::client::{Counters, Remote};
use longhaul_files::plan::{self, Place};
use longhaul_files::progress::{Bar, Summary};
use longhaul_forward::Client;

use crate::args::{parse_server_url, CpArgs};

pub(crate) async fn run(a: CpArgs) -> anyhow::Result<()> {
    let (dest, sources) = match a.paths.split_last() {
        Some((d, s)) if !s.is_empty() => (Place::parse(d), s.iter().map(|s| Place::parse(s))),
        _ => bail!("give at least one source and a destination"),
    };
    let sources: Vec<Place> = sources.collect();
    let remote_of = |p: &Place| match p {
        Place::Remote { server, path } => Some((server.clone(), path.clone())),
        Place::Local(_) => None,
    };
    // The server and what goes which way.
    let (server, upload) = match (&dest, sources.iter().find_map(remote_of)) {
        (Place::Remote { server, .. }, None) => (server.clone(), true),
        (Place::Local(_), Some((server, _))) => (server, false),
        (Place::Remote { .. }, Some(_)) => bail!("both sides are remote: copy between a local path and one server"),
        (Place::Local(_), None) => bail!("no side is remote: write the server's side as SERVER:/PATH (e.g. tls://host:4433:/dir/)"),
    };
    let mut remote_paths = vec![];
    let mut local_paths = vec![];
    for s in &sources {
        match s {
            Place::Remote {
                server: other,
                path,
            } if !upload => {
                if *other != server {
                    bail!("sources on two servers ({server}, {other}): copy from one at a time");
                }
                remote_paths.push(path.clone());
            }
            Place::Local(p) if upload => local_paths.push(p.clone()),
            _ => bail!("mixed local and remote sources: copy one way at a time"),
        }
    }
    for p in remote_paths.iter().chain(match &dest {
        Place::Remote { path, .. } => Some(path),
        Place::Local(_) => None,
    }) {
        plan::rel(p)?;
    }
    let url = parse_server_url(&server).map_err(|e| anyhow::anyhow!("{server}: {e}"))?;
    let cfg = crate::connect::client_config(&url, &a.conn, &a.session, false)?;
    let client = Arc::new(Client::start(cfg).await?);
    let remote = Remote {
        runtime: tokio::runtime::Handle::current(),
        session: {
            let c = client.clone();
            Arc::new(move || c.session())
        },
    };
    let (recursive, jobs, json) = (a.recursive, a.jobs as usize, a.json);
    let work = tokio::task::spawn_blocking(move || -> anyhow::Result<Summary> {
        let started = Instant::now();
        let mut conn = remote.connect()?;
        let tasks = match &dest {
            Place::Remote { path, .. } => {
                plan::plan_upload(&mut conn, &local_paths, path, recursive)?
            }
            Place::Local(d) => plan::plan_download(&mut conn, &remote_paths, d, recursive)?,
        };
        let counters = Arc::new(Counters::default());
        let total = tasks.iter().map(|t| t.size()).sum();
        let bar = Bar::start(total, counters.clone(), !json);
        let (copied, errors) = plan::run(&remote, conn, tasks, jobs, &counters);
        drop(bar);
        Ok(Summary::new(copied, errors, &counters, started))
    });
    let summary = tokio::select! {
        r = work => r?,
        _ = tokio::signal::ctrl_c() => {
            // What was written stays as a partial file: the same command
            // continues from it. Ending the session tells the server so.
            client.shutdown("interrupted", std::time::Duration::from_secs(1)).await;
            bail!("interrupted: run the same command again to resume");
        }
    };
    // Told, the server forgets the session at once instead of keeping it
    // for a resume.
    client
        .shutdown("copy done", std::time::Duration::from_secs(2))
        .await;
    let summary = summary?;
    for e in &summary.errors {
        eprintln!("longhaul: {}", crate::terminal_safe(e));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        eprintln!("{}", summary.line());
    }
    if !summary.errors.is_empty() {
        bail!(
            "{} of {} files failed",
            summary.errors.len(),
            summary.errors.len() + summary.files
        );
    }
    Ok(())
}
