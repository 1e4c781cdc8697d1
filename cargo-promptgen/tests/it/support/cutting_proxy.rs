//! An HTTP/1.1 proxy on loopback that forwards requests to a server until it has forwarded a
//! number of `PUT`s, then drops the connection of the next one and stops listening: a remote
//! that dies in the middle of an upload, at a known point.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

pub struct CuttingProxy {
    pub url: String,
    cut: Arc<AtomicBool>,
    puts: Arc<AtomicUsize>,
}

impl CuttingProxy {
    /// Forwards to `upstream` (`http://host:port`) until `puts_allowed` PUTs went through.
    pub fn start(upstream: &str, puts_allowed: usize) -> CuttingProxy {
        let upstream: SocketAddr = upstream.trim_start_matches("http://").trim_end_matches('/').parse().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let cut = Arc::new(AtomicBool::new(false));
        let puts = Arc::new(AtomicUsize::new(0));
        let (cut2, puts2) = (cut.clone(), puts.clone());
        std::thread::spawn(move || {
            // Bounded: the proxy lives at most a minute.
            for _ in 0..6000 {
                if cut2.load(Ordering::SeqCst) {
                    return; // drops the listener: further connections are refused
                }
                match listener.accept() {
                    Ok((client, _)) => {
                        let (cut, puts) = (cut2.clone(), puts2.clone());
                        std::thread::spawn(move || serve(client, upstream, puts_allowed, &cut, &puts));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        CuttingProxy { url, cut, puts }
    }

    /// The PUTs forwarded.
    pub fn puts(&self) -> usize {
        self.puts.load(Ordering::SeqCst)
    }

    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}

/// One request: read it, forward it with `Connection: close`, copy the reply back, close.
fn serve(client: TcpStream, upstream: SocketAddr, allowed: usize, cut: &AtomicBool, puts: &AtomicUsize) {
    client.set_nonblocking(false).ok();
    client.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let mut head = Vec::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(value) = lower.strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        if !lower.starts_with("connection:") {
            head.extend_from_slice(line.as_bytes());
        }
    }
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    if head.starts_with(b"PUT ") {
        if cut.load(Ordering::SeqCst) || puts.fetch_add(1, Ordering::SeqCst) >= allowed {
            puts.fetch_min(allowed, Ordering::SeqCst);
            cut.store(true, Ordering::SeqCst);
            return; // the connection drops without a reply
        }
    } else if cut.load(Ordering::SeqCst) {
        return;
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    let Ok(mut server) = TcpStream::connect(upstream) else { return };
    if server.write_all(&head).and_then(|_| server.write_all(&body)).is_err() {
        return;
    }
    let mut reply = Vec::new();
    let _ = server.read_to_end(&mut reply);
    let mut client = client;
    let _ = client.write_all(&reply);
}
