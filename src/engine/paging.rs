//! Paging a region's batches (and their operations): the page size a
//! request asks for, the opaque page tokens (a keyset position and a
//! fingerprint of the query they continue) and a page cut short before it
//! outgrows what a gRPC client accepts. The queue pages
//! (`queues.rs`) use the same sizes and tokens.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::batches::ListRequest;
use super::{Engine, Error};
use crate::api::quote;
use crate::store::{BatchRecord, Filter};

const DEFAULT_PAGE_SIZE: u32 = 20;
const MAX_PAGE_SIZE: u32 = 1000;
/// The most a page carries, counted as its batches' JSON: a page of big
/// batches stops early, with a next-page token (AIP-158 allows short
/// pages), rather than pass the 4 MiB that gRPC clients accept by
/// default (a batch can be up to `server.max_body_bytes`).
const MAX_PAGE_BYTES: usize = 3 << 20;
/// What a listed batch carries beyond its spec (state, history, runtime
/// info, flexq's extension), at most, in bytes of JSON.
const LISTED_BEYOND_SPEC: usize = 4 << 10;

/// The length of a value's JSON, without writing it anywhere.
fn json_len<T: serde::Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail; a value that cannot be written
    // counts as nothing.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

impl Engine {
    /// The records of a list page and the token of the next.
    pub(super) async fn page(&self, req: ListRequest) -> Result<(Vec<BatchRecord>, String), Error> {
        let ListRequest {
            project,
            region,
            page_size,
            page_token,
            filter,
            order_by,
        } = req;
        let page_size = page_size_of(page_size.as_deref(), DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)?;
        if let Some(order) = order_by.as_deref() {
            let normal = order
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_ascii_lowercase();
            if !normal.is_empty() && normal != "create_time desc" {
                return Err(Error::invalid_field(
                    "order_by",
                    format!(
                        "{} is not supported; accepted: \"create_time desc\" (the default)",
                        quote(order)
                    ),
                ));
            }
        }
        let filter_text = filter.unwrap_or_default();
        let filter = Filter::parse(&filter_text).map_err(|e| Error::invalid_field("filter", e))?;
        let before = match page_token.as_deref() {
            None | Some("") => None,
            Some(token) => Some(decode_token(token, &project, &region, &filter_text)?),
        };
        let page = self
            .shared
            .store
            .list(&project, &region, &filter, page_size, before)
            .await?;
        let mut batches = page.batches;
        let mut next_before = page.next_before_seq;
        let mut bytes = 0;
        let over = batches.iter().position(|b| {
            bytes += json_len(&b.spec) + LISTED_BEYOND_SPEC;
            bytes > MAX_PAGE_BYTES
        });
        // At least one batch a page, so every page moves on.
        if let Some(cut) = over.map(|i| i.max(1)).filter(|&i| i < batches.len()) {
            batches.truncate(cut);
            next_before = batches.last().map(|b| b.seq);
        }
        let next = next_before
            .map(|seq| encode_token(seq, &project, &region, &filter_text))
            .unwrap_or_default();
        Ok((batches, next))
    }
}

/// A requested page size: absent, empty or 0 is `default`; above `max`
/// it is lowered to `max` (AIP-158); anything else is an error naming it.
pub(super) fn page_size_of(raw: Option<&str>, default: u32, max: u32) -> Result<u32, Error> {
    match raw.map(str::trim) {
        None | Some("") | Some("0") => Ok(default),
        Some(raw) => match raw.parse::<i64>() {
            Ok(n) if n > 0 => Ok(n.min(i64::from(max)) as u32),
            _ => Err(Error::invalid_field(
                "page_size",
                format!(
                    "{} is not a page size; accepted: 1 to {max} (0 or absent: {default})",
                    quote(raw)
                ),
            )),
        },
    }
}

/// Page tokens are opaque to clients: a version, the keyset position and a
/// fingerprint of the query they continue, so a token cannot be replayed
/// against another filter or collection.
pub(super) fn encode_token(before_seq: i64, project: &str, region: &str, filter: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!(
        "v1:{before_seq}:{:016x}",
        fingerprint(project, region, filter)
    ))
}

pub(super) fn decode_token(
    token: &str,
    project: &str,
    region: &str,
    filter: &str,
) -> Result<i64, Error> {
    let invalid = || {
        Error::invalid_field(
            "page_token",
            format!(
                "{} is not a page token of this list (same parent and filter); start again without a token",
                crate::api::quote(token)
            ),
        )
    };
    let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
    let raw = String::from_utf8(raw).map_err(|_| invalid())?;
    let mut parts = raw.split(':');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("v1"), Some(seq), Some(fp), None)
            if fp == format!("{:016x}", fingerprint(project, region, filter)) =>
        {
            seq.parse().map_err(|_| invalid())
        }
        _ => Err(invalid()),
    }
}

/// FNV-1a over the query: stable across processes and versions (unlike
/// `DefaultHasher`), so a token minted by one replica works on another.
fn fingerprint(project: &str, region: &str, filter: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in project
        .bytes()
        .chain([0])
        .chain(region.bytes())
        .chain([0])
        .chain(filter.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}
