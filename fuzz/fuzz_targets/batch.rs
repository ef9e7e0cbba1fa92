//! Batch validation (spec §2–§3): any JSON body that decodes as a Batch is
//! validated to a cluster request or a list of violations, never a panic.
#![no_main]

use std::sync::LazyLock;

use flexq::config::Config;
use flexq::spec::Policy;
use libfuzzer_sys::fuzz_target;

// The policy the embedded default config gives: what a fresh server checks
// batches against.
static POLICY: LazyLock<Policy> = LazyLock::new(|| {
    Config::load_without_env(None)
        .expect("embedded config")
        .policy()
});

fuzz_target!(|data: &[u8]| {
    if let Ok(batch) = serde_json::from_slice::<flexq::api::Batch>(data) {
        let _ = flexq::spec::validate(&batch, "demo", "us-central1", &POLICY);
    }
});
