//! An HTTP/1.1 keep-alive server on async-io, written as a smol user writes one:
//! `Async<TcpListener>`, an `async-executor` with one task per connection.
//!
//! ```text
//! pollshot-bench-http [--port PORT] [--threads T]
//! ```
//!
//! - `--port PORT`: 127.0.0.1 port (default 0: any free one); the bound address is
//!   printed on stdout as `listening on 127.0.0.1:PORT`.
//! - `--threads T`: executor threads (default 1), each in `async_io::block_on`,
//!   so one of them at a time drives async-io's reactor.
//!
//! Every request (anything ending in an empty line; bodies are not expected) gets
//! the same 13-byte `200 OK`; pipelined requests read together are answered in one
//! write. Runs until killed.

use async_executor::Executor;
use async_io::Async;
use futures_lite::{future, AsyncReadExt, AsyncWriteExt};
use std::io;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

const RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n\r\nHello, world!";

/// Serves one connection until the client closes it.
async fn serve(mut stream: Async<TcpStream>) -> io::Result<()> {
    let mut buf = vec![0u8; 8192];
    let mut filled = 0;
    let mut out = Vec::with_capacity(RESPONSE.len() * 4);
    loop {
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Ok(());
        }
        filled += n;
        // Answer every complete request in the buffer.
        let mut start = 0;
        while let Some(end) = find_end(&buf[start..filled]) {
            out.extend_from_slice(RESPONSE);
            start += end;
        }
        buf.copy_within(start..filled, 0);
        filled -= start;
        if filled == buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request too large",
            ));
        }
        if !out.is_empty() {
            stream.write_all(&out).await?;
            out.clear();
        }
    }
}

/// The length of the first request in `b` (through its empty line), if complete.
fn find_end(b: &[u8]) -> Option<usize> {
    b.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

fn arg(args: &[String], name: &str, default: usize) -> usize {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} needs a number")),
        None => default,
    }
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let port = arg(&args, "--port", 0);
    let threads = arg(&args, "--threads", 1).max(1);
    let listener = Async::<TcpListener>::bind(([127, 0, 0, 1], port as u16))?;
    println!("listening on {}", listener.get_ref().local_addr()?);
    let ex = Arc::new(Executor::new());
    for _ in 1..threads {
        let ex = Arc::clone(&ex);
        std::thread::spawn(move || async_io::block_on(ex.run(future::pending::<()>())));
    }
    async_io::block_on(ex.run(async {
        loop {
            let (stream, _) = listener.accept().await?;
            stream.get_ref().set_nodelay(true)?;
            ex.spawn(async move {
                let _ = serve(stream).await;
            })
            .detach();
        }
    }))
}
