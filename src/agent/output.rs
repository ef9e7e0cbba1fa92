//! The driver's output on its way to the server: read from the driver's
//! stdout and stderr, kept in the driver's log and a tail for the failure
//! summary, and uploaded in order from the offset the server last
//! acknowledged.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::client::{AgentClient, CallError};
use super::work::TAIL_BYTES;
use crate::launch::fallback::Stream;

async fn read_into<R: AsyncRead + Unpin>(
    mut r: R,
    stream: Stream,
    tx: mpsc::Sender<(Stream, Vec<u8>)>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send((stream, buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Streams the driver's stdout and stderr to its log file and to the
/// server as they come; returns the tail (for the failure summary) and
/// what the RAPIDS Accelerator said could not run on the GPU once both
/// close.
pub(super) async fn pump_output(
    client: AgentClient,
    epoch: String,
    uuid: String,
    stdout: Option<tokio::process::ChildStdout>,
    stderr: Option<tokio::process::ChildStderr>,
    log: PathBuf,
) -> (Vec<u8>, crate::api::CpuFallback) {
    let (tx, mut rx) = mpsc::channel::<(Stream, Vec<u8>)>(64);
    if let Some(out) = stdout {
        tokio::spawn(read_into(out, Stream::Stdout, tx.clone()));
    }
    if let Some(err) = stderr {
        tokio::spawn(read_into(err, Stream::Stderr, tx.clone()));
    }
    drop(tx);
    let mut file = tokio::fs::File::create(&log).await.ok();
    let mut tail: Vec<u8> = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut offset = 0u64;
    let mut fallback = crate::launch::fallback::FallbackCounter::default();
    while let Some((stream, first)) = rx.recv().await {
        // The fallback counter reads each stream's lines apart: a line of
        // stderr split across reads stays whole whatever stdout printed
        // between its pieces.
        fallback.feed_from(stream, &first);
        let mut chunk = first;
        while let Ok((stream, more)) = rx.try_recv() {
            fallback.feed_from(stream, &more);
            chunk.extend_from_slice(&more);
        }
        if offset == 0 && pending.is_empty() {
            tracing::info!(batch_uuid = %uuid, "driver first output");
        }
        if let Some(f) = file.as_mut() {
            let _ = f.write_all(&chunk).await;
        }
        tail.extend_from_slice(&chunk);
        if tail.len() > 2 * TAIL_BYTES {
            tail.drain(..tail.len() - TAIL_BYTES);
        }
        pending.extend_from_slice(&chunk);
        send_output(&client, &epoch, &uuid, &mut offset, &mut pending, false).await;
    }
    for _ in 0..5 {
        if pending.is_empty() {
            break;
        }
        send_output(&client, &epoch, &uuid, &mut offset, &mut pending, true).await;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    if let Some(f) = file.as_mut() {
        let _ = f.flush().await;
    }
    let start = tail.len().saturating_sub(TAIL_BYTES);
    (tail.split_off(start), fallback.finish())
}

/// Largest upload: well under the server's body limit.
const UPLOAD_BYTES: usize = 256 * 1024;

/// Uploads what of `pending` is complete UTF-8 (all of it when `last`), in
/// slices of at most [`UPLOAD_BYTES`]; keeps the rest for the next try when
/// the server is unreachable.
async fn send_output(
    client: &AgentClient,
    epoch: &str,
    uuid: &str,
    offset: &mut u64,
    pending: &mut Vec<u8>,
    last: bool,
) {
    while !pending.is_empty() {
        let limit = pending.len().min(UPLOAD_BYTES);
        let whole = limit == pending.len();
        let take = match std::str::from_utf8(&pending[..limit]) {
            Ok(_) => limit,
            // Cut before a character split across reads (or by the slice),
            // unless nothing more will come.
            Err(e) if e.error_len().is_none() && !(last && whole) => e.valid_up_to(),
            Err(_) => limit,
        };
        if take == 0 {
            return;
        }
        let text = String::from_utf8_lossy(&pending[..take]).into_owned();
        match client.output(epoch, uuid, *offset, text).await {
            Ok(next) => {
                *offset = next;
                pending.drain(..take);
            }
            Err(CallError::Unavailable(e)) => {
                tracing::warn!(error = %e, "driver output upload failed; will retry");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "driver output refused; dropping it");
                pending.clear();
            }
        }
    }
}
