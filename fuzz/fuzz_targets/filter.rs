//! The AIP-160 filter parser (`?filter=` on list): any input is parsed or
//! refused with a message, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = flexq::store::Filter::parse(text);
    }
});
