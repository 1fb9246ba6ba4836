//! The operator binary as a child process: killed when dropped, its JSON log lines read as they
//! come. Shared by the `run` tests and the operator benchmark.
#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    process::Child,
    sync::mpsc::Receiver,
    time::Duration,
};

/// Kills and waits for the child when dropped, so a failing test leaves no process behind.
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lines the child writes to its (piped) stderr. A thread keeps draining the pipe, so the
/// child never blocks on it, whether or not anyone reads the lines.
pub fn log_lines(child: &mut Child) -> Receiver<String> {
    let output = BufReader::new(child.stderr.take().expect("stderr is piped"));
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        output
            .lines()
            .map_while(Result::ok)
            .for_each(|l| drop(tx.send(l)))
    });
    lines
}

/// Waits for the JSON log line whose `message` is `message`, returning its `addr` field.
pub fn wait_for_addr(lines: &Receiver<String>, message: &str) -> SocketAddr {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the operator never logged {message:?}"));
        if let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line)
            && entry["message"] == message
        {
            return entry["addr"].as_str().unwrap().parse().unwrap();
        }
    }
}

/// Waits up to `within` for the JSON log line whose `message` is `message`, skipping others.
pub fn wait_for_message(
    lines: &Receiver<String>,
    message: &str,
    within: Duration,
) -> Option<serde_json::Value> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = lines.recv_timeout(left).ok()?;
        if let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line)
            && entry["message"] == message
        {
            return Some(entry);
        }
    }
}
