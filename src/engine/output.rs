//! The driver's output: the agent that runs a batch's driver uploads it
//! in chunks ([`Engine::upload_output`], fenced by the node's epoch like
//! every call of an agent), and callers read it from an offset, waiting
//! for more if they ask ([`Engine::read_output`], how `flexq batches
//! wait` streams it).

use super::long_poll::Kind;
use super::nodes::{parse_epoch_str, wait_for};
use super::{Engine, Error};
use crate::api::{BatchName, quote};
use crate::protocol::{BatchOutput, OutputUpload};
use crate::store::StoreError;

/// Most output bytes one read returns.
const OUTPUT_READ_MAX: usize = 1 << 20;

/// A read of a batch's driver output.
#[derive(Debug, Clone)]
pub struct OutputRead {
    pub name: BatchName,
    pub offset: Option<String>,
    pub wait_for: Option<String>,
}

impl Engine {
    /// Appends driver output from the node that runs the driver; answers
    /// the offset the next chunk starts at.
    pub async fn upload_output(&self, node: &str, req: OutputUpload) -> Result<u64, Error> {
        let epoch = parse_epoch_str(&req.epoch)?;
        let offset: u64 = req
            .offset
            .parse()
            .ok()
            .filter(|o| *o <= i64::MAX as u64 / 2)
            .ok_or_else(|| {
                Error::invalid_field(
                    "offset",
                    format!("{} is not a byte offset", quote(&req.offset)),
                )
            })?;
        self.check_epoch_now(node, epoch).await?;
        let next = self
            .shared
            .store
            .append_output(
                node,
                &req.uuid,
                offset,
                req.data.as_bytes(),
                self.config().agents.max_output_bytes,
            )
            .await?;
        self.output_written();
        Ok(next)
    }

    /// The driver's output of a batch from `offset`. With `wait_for`,
    /// waits for more output or the end of the batch (how `flexq batches
    /// wait` streams it).
    pub async fn read_output(&self, req: OutputRead) -> Result<BatchOutput, Error> {
        let OutputRead {
            name,
            offset,
            wait_for: wait,
        } = req;
        let offset: u64 = match &offset {
            None => 0,
            Some(o) => o
                .parse()
                .ok()
                .filter(|o| *o <= i64::MAX as u64 / 2)
                .ok_or_else(|| {
                    Error::invalid_field("offset", format!("{} is not a byte offset", quote(o)))
                })?,
        };
        let wait = match &wait {
            None => std::time::Duration::ZERO,
            Some(text) => wait_for(text)?.min(
                self.config()
                    .server
                    .request_timeout
                    .saturating_sub(std::time::Duration::from_secs(5)),
            ),
        };
        let deadline = tokio::time::Instant::now() + wait;
        // New output, or the batch's end (a work change).
        let mut changes = self.watch_work();
        let mut written = self.watch_output();
        let mut waiting = None;
        loop {
            changes.borrow_and_update();
            written.borrow_and_update();
            let record = self.shared.store.get(&name).await.map_err(|e| match e {
                StoreError::NotFound => Error::not_found("batch", &name.to_string()),
                other => other.into(),
            })?;
            let chunk = self
                .shared
                .store
                .read_output(record.seq, offset, OUTPUT_READ_MAX)
                .await?;
            let done = record.state.is_terminal() && chunk.next_offset >= chunk.total;
            if !chunk.data.is_empty() || done || tokio::time::Instant::now() >= deadline {
                let answer = BatchOutput {
                    data: String::from_utf8_lossy(&chunk.data).into_owned(),
                    next_offset: chunk.next_offset.to_string(),
                    total_bytes: chunk.total.to_string(),
                    done,
                    truncated: record.run.output_truncated,
                };
                return Ok(answer);
            }
            waiting.get_or_insert_with(|| self.shared.long_polls.waiting(Kind::Output));
            tokio::select! {
                _ = changes.changed() => {}
                _ = written.changed() => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}
