//! The metrics endpoint's HTTP server: a small HTTP/1.1 responder of its
//! own rather than a server crate (tiny_http, tried first, blocks for good
//! on a request whose announced body never comes).
//!
//! A thread per connection, at most `CONNECTIONS` at once, the connection
//! closed after one answer. Each has `HEAD_TIME` to send its request head
//! (at most 8 KiB; no body is read) and `ANSWER_TIME` to take the answer,
//! in all, however slowly it trickles bytes: a per-read timeout alone let a
//! client that sent a byte every few seconds hold its thread for ever, and
//! sixteen of them kept every scrape out. And a connection beyond the limit
//! takes the place of the one that has waited longest for its request
//! head, if any does: a scraper sends its head at once, so clients that
//! open connections and send nothing (or dribble) cannot hold the
//! endpoint shut however many they open; only when every connection is
//! being answered is a newcomer answered 503.

use super::{render, Sample};
use crate::error::{CliError, Result};
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connections served at once.
const CONNECTIONS: usize = 16;
/// How long a connection has to send its request head, in all.
const HEAD_TIME: Duration = Duration::from_secs(5);
/// How long a connection has to take its answer, in all.
const ANSWER_TIME: Duration = Duration::from_secs(10);

/// The connections being served.
#[derive(Default)]
struct Open {
    next: u64,
    conns: Vec<Conn>,
}

struct Conn {
    id: u64,
    accepted: Instant,
    /// Still waiting for its request head: may be pushed out by a newcomer.
    reading: bool,
    /// The same socket, to shut it when pushed out.
    socket: TcpStream,
}

impl Open {
    /// Takes a place for a connection accepted now: its id, or None when
    /// every place is taken by a connection being answered. Where all are
    /// taken, the one that has waited longest for its head is shut (its
    /// thread sees the socket closed and ends) and gives up its place.
    fn admit(&mut self, socket: TcpStream) -> Option<u64> {
        if self.conns.len() >= CONNECTIONS {
            let oldest = self
                .conns
                .iter()
                .enumerate()
                .filter(|(_, c)| c.reading)
                .min_by_key(|(_, c)| c.accepted)
                .map(|(i, _)| i)?;
            let out = self.conns.swap_remove(oldest);
            let _ = out.socket.shutdown(Shutdown::Both);
            tracing::debug!(
                "metrics: a connection that sent no request head in time made room for another"
            );
        }
        self.next += 1;
        self.conns.push(Conn {
            id: self.next,
            accepted: Instant::now(),
            reading: true,
            socket,
        });
        Some(self.next)
    }

    fn answering(&mut self, id: u64) {
        if let Some(c) = self.conns.iter_mut().find(|c| c.id == id) {
            c.reading = false;
        }
    }

    fn done(&mut self, id: u64) {
        self.conns.retain(|c| c.id != id);
    }
}

/// Serves `GET /metrics` on `addr` until `stop`, each scrape rendering
/// what `sample` returns. Binds before returning, so a port in use is an
/// error of the daemon's start rather than a log line.
pub fn serve(
    addr: SocketAddr,
    sample: Arc<dyn Fn() -> Sample + Send + Sync>,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>> {
    let listener = std::net::TcpListener::bind(addr).map_err(|e| {
        CliError::failed(format!(
            "cannot serve metrics on {addr}: {e} (another exporter on the port? choose another with [metrics] listen)"
        ))
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| CliError::failed(format!("metrics listener: {e}")))?;
    tracing::info!(%addr, "metrics served at http://{addr}/metrics");
    let open = Arc::new(Mutex::new(Open::default()));
    Ok(std::thread::spawn(move || {
        while !stop.load(Ordering::Acquire) {
            match listener.accept() {
                Ok((mut conn, _)) => {
                    let id = conn
                        .try_clone()
                        .ok()
                        .and_then(|socket| open.lock().admit(socket));
                    let Some(id) = id else {
                        let _ = conn.set_nonblocking(true);
                        let _ = respond(&mut conn, 503, "too many connections\n", "text/plain");
                        continue;
                    };
                    let (sample, held) = (sample.clone(), open.clone());
                    let spawned = std::thread::Builder::new()
                        .name("metrics-conn".into())
                        .spawn(move || {
                            let answered = answer(conn, sample.as_ref(), || {
                                held.lock().answering(id);
                            });
                            if let Err(e) = answered {
                                tracing::debug!("metrics request: {e}");
                            }
                            held.lock().done(id);
                        });
                    if let Err(e) = spawned {
                        // The connection went with the closure: closed.
                        open.lock().done(id);
                        tracing::warn!("metrics: no thread for a connection: {e}");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => {
                    tracing::warn!("metrics listener: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }))
}

/// The time left until `deadline`, as a socket timeout: an error once
/// there is none.
fn left(deadline: Instant, what: &str) -> std::io::Result<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the client took too long to {what}"),
        ));
    }
    Ok(d)
}

/// Reads one request head (calling `head_read` once it is in) and answers
/// it.
fn answer(
    mut conn: TcpStream,
    sample: &(dyn Fn() -> Sample + Send + Sync),
    head_read: impl FnOnce(),
) -> std::io::Result<()> {
    const LIMIT: usize = 8 << 10;
    conn.set_nonblocking(false)?;
    let deadline = Instant::now() + HEAD_TIME;
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > LIMIT {
            head_read();
            return respond(&mut conn, 431, "request head too large\n", "text/plain");
        }
        conn.set_read_timeout(Some(left(deadline, "send its request")?))?;
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
    }
    head_read();
    let text = String::from_utf8_lossy(&head);
    let mut words = text.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => {
            let body = render(&sample());
            respond(
                &mut conn,
                200,
                &body,
                "text/plain; version=0.0.4; charset=utf-8",
            )
        }
        ("GET", "/") => respond(
            &mut conn,
            200,
            "raidctl daemon: metrics at /metrics\n",
            "text/plain",
        ),
        ("GET", _) => respond(&mut conn, 404, "not found: try /metrics\n", "text/plain"),
        _ => respond(&mut conn, 405, "only GET\n", "text/plain"),
    }?;
    let _ = conn.flush();
    Ok(())
}

/// Writes an answer, taking at most `ANSWER_TIME` however slowly the
/// client reads.
fn respond(conn: &mut TcpStream, code: u16, body: &str, kind: &str) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "Request Header Fields Too Large",
    };
    let bytes = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let deadline = Instant::now() + ANSWER_TIME;
    let mut rest = bytes.as_bytes();
    while !rest.is_empty() {
        conn.set_write_timeout(Some(left(deadline, "take its answer")?))?;
        match conn.write(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
