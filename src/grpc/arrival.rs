//! A bound on the arrival of each gRPC request message
//! (`server.grpc_message_timeout`). The gRPC routes are outside REST's
//! `server.request_timeout`, and a method's own deadline
//! ([`super::Front::call`]) starts only once tonic has decoded its
//! message: a call whose message never finishes would otherwise hold its
//! stream, and its connection, for ever.
//!
//! The request body is read through [`Arrival`], which follows the gRPC
//! framing (a flag byte, a 4-byte length, the message): each message, and
//! the end of the stream, must come within the timeout of the call's start
//! or of the message before. Otherwise the body fails with
//! DEADLINE_EXCEEDED, which tonic answers as the call's status.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use hyper::body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// `request`, its body bounded by `limit` per message.
pub(super) fn bound(request: Request, limit: Duration) -> Request {
    request.map(|body| {
        Body::new(Arrival {
            body,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
            prefix: [0; 5],
            got: 0,
            left: 0,
            expired: false,
        })
    })
}

/// A gRPC request body that fails when a message is late.
struct Arrival {
    body: Body,
    limit: Duration,
    deadline: Pin<Box<Sleep>>,
    /// The 5-byte prefix of the message arriving, `got` bytes of it so far;
    /// once whole, `left` bytes of the message are still to come.
    prefix: [u8; 5],
    got: usize,
    left: u64,
    expired: bool,
}

impl Arrival {
    /// Follows the framing over `data`; true when a message ended in it.
    fn take(&mut self, mut data: &[u8]) -> bool {
        let mut ended = false;
        while !data.is_empty() {
            if self.got < self.prefix.len() {
                let n = (self.prefix.len() - self.got).min(data.len());
                self.prefix[self.got..self.got + n].copy_from_slice(&data[..n]);
                self.got += n;
                data = &data[n..];
                if self.got == self.prefix.len() {
                    let [_, a, b, c, d] = self.prefix;
                    self.left = u64::from(u32::from_be_bytes([a, b, c, d]));
                }
            } else {
                let n = usize::try_from(self.left).map_or(data.len(), |left| left.min(data.len()));
                self.left -= n as u64;
                data = &data[n..];
            }
            if self.got == self.prefix.len() && self.left == 0 {
                ended = true;
                self.got = 0;
            }
        }
        ended
    }
}

impl HttpBody for Arrival {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    if this.take(data) {
                        let next = Instant::now() + this.limit;
                        this.deadline.as_mut().reset(next);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => Poll::Ready(other),
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.expired = true;
                crate::metrics::record_grpc_message_timeout();
                let status = tonic::Status::deadline_exceeded(format!(
                    "the request message did not arrive within server.grpc_message_timeout ({}ms)",
                    this.limit.as_millis()
                ));
                Poll::Ready(Some(Err(axum::Error::new(status))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival() -> Arrival {
        Arrival {
            body: Body::empty(),
            limit: Duration::from_secs(1),
            deadline: Box::pin(tokio::time::sleep(Duration::from_secs(1))),
            prefix: [0; 5],
            got: 0,
            left: 0,
            expired: false,
        }
    }

    #[tokio::test]
    async fn a_message_ends_where_its_length_says_however_it_is_split() {
        let mut message = vec![0, 0, 0, 0, 3, b'a', b'b', b'c'];
        message.extend([0, 0, 0, 0, 0]);
        // Whole: both messages end in it.
        assert!(arrival().take(&message));
        // Byte by byte: a message ends at its last byte, and only there.
        let mut a = arrival();
        let ends: Vec<usize> = (0..message.len())
            .filter(|&i| a.take(&message[i..=i]))
            .collect();
        assert_eq!(ends, vec![7, 12]);
        // A prefix alone, or half a payload, ends nothing.
        assert!(!arrival().take(&message[..4]));
        assert!(!arrival().take(&message[..6]));
    }
}
