//! The telemetry upload (docs/rules.md#gpu-telemetry): any JSON body that
//! decodes as an upload is checked whole, never a panic; one the check
//! takes holds only points the store can keep (every field in range).
#![no_main]

use flexq::engine::check_telemetry;
use flexq::protocol::GpuTelemetry;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(upload) = serde_json::from_slice::<GpuTelemetry>(data) else {
        return;
    };
    if check_telemetry(&upload).is_ok() {
        for points in &upload.batches {
            assert!(points.points.len() <= flexq::gpu::MAX_POINTS);
            for p in &points.points {
                assert!(p.check().is_ok(), "taken, yet out of range: {p:?}");
                assert!(p.gpu_seconds().is_finite() && p.gpu_seconds() > 0.0);
            }
        }
    }
});
