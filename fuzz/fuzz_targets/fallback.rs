//! The RAPIDS fallback counter (src/launch/fallback.rs): a driver's stdout
//! and stderr, cut into chunks anywhere (inside a line, inside a UTF-8
//! character) and interleaved any way, count exactly what the two streams
//! fed whole count (the reasons kept may come in another order), never a
//! panic.
#![no_main]

use flexq::launch::fallback::{FallbackCounter, MAX_REASONS, Stream};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte splits the rest into stdout and stderr; the bytes
    // after the split in each stream choose where its chunks end.
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let at = usize::from(split) * rest.len() / 256;
    let (out, err) = rest.split_at(at);
    let mut whole = FallbackCounter::default();
    whole.feed_from(Stream::Stdout, out);
    whole.feed_from(Stream::Stderr, err);
    let mut chunked = FallbackCounter::default();
    let (mut o, mut e) = (out, err);
    let mut turn = 0usize;
    while !o.is_empty() || !e.is_empty() {
        let (stream, left) = if (turn % 2 == 0 && !o.is_empty()) || e.is_empty() {
            (Stream::Stdout, &mut o)
        } else {
            (Stream::Stderr, &mut e)
        };
        let n = 1 + usize::from(left[0]) % left.len().min(37);
        let (chunk, tail) = left.split_at(n.min(left.len()));
        chunked.feed_from(stream, chunk);
        *left = tail;
        turn += usize::from(chunk[0] % 3);
    }
    // Lines of the two streams complete in the order of the chunks, so the
    // reasons kept (the first five distinct) come in that order: the count
    // is the same, and so are the reasons where fewer than five were kept.
    let (mut chunked, mut whole) = (chunked.finish(), whole.finish());
    assert_eq!(chunked.operators, whole.operators);
    assert_eq!(chunked.reasons.len(), whole.reasons.len());
    if whole.reasons.len() < MAX_REASONS {
        chunked.reasons.sort();
        whole.reasons.sort();
        assert_eq!(chunked, whole);
    }
});
