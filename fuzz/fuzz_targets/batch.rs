//! Batch validation (spec §2–§3): any JSON body that decodes as a Batch is
//! validated to a cluster request or a list of violations, never a panic.
#![no_main]

use std::sync::LazyLock;

use flexq::config::Config;
use libfuzzer_sys::fuzz_target;

static CONFIG: LazyLock<Config> =
    LazyLock::new(|| Config::load_without_env(None).expect("embedded config"));

fuzz_target!(|data: &[u8]| {
    if let Ok(batch) = serde_json::from_slice::<flexq::api::Batch>(data) {
        let _ = flexq::spec::validate(&batch, "demo", "us-central1", &CONFIG);
    }
});
