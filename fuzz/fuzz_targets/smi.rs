//! nvidia-smi's output as the agent reads it (src/agent/discovery.rs and
//! src/agent/gpus.rs): `-L` lists only digit addresses; the query's CSV
//! parses or is refused with a reason, never a panic; and what parses makes
//! a point the server takes (a point it refuses would lose the whole
//! upload of every batch on the node).
#![no_main]

use chrono::{TimeZone, Utc};
use flexq::agent::discovery::parse_nvidia_smi;
use flexq::agent::gpus::parse_smi_query;
use flexq::gpu::point;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for gpu in parse_nvidia_smi(&text) {
        assert!(!gpu.is_empty() && gpu.bytes().all(|b| b.is_ascii_digit()), "{gpu:?}");
    }
    let Ok(readings) = parse_smi_query(&text) else {
        return;
    };
    // A part holds at most 64 GPUs (the most a point may stand for).
    let mut all: Vec<String> = readings.iter().map(|r| r.index.clone()).collect();
    all.dedup();
    all.truncate(64);
    let time = Utc.with_ymd_and_hms(2026, 12, 4, 12, 0, 0).unwrap();
    if let Some(p) = point(time, 5.0, &all, &readings) {
        assert!(p.check().is_ok(), "{:?} from {readings:?}", p.check());
    }
});
