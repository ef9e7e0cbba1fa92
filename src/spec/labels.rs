//! Labels: how many, and what a key and a value may be — one rule, read
//! by the create and by the list filter (`labels.KEY`).

use super::Violations;
use crate::api::{Batch, quote};

/// What a label key may be, in words (the create's and the filter's
/// errors say it).
pub const LABEL_KEY_RULE: &str =
    "1 to 63 characters of lowercase letters, digits, '-' and '_', starting with a letter";

/// Whether `key` is a label key: [`LABEL_KEY_RULE`].
pub fn is_label_key(key: &str) -> bool {
    key.len() <= 63
        && key.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && key.bytes().all(is_label_byte)
}

/// Whether `value` is a label value: empty or up to 63 characters of
/// lowercase letters, digits, '-' and '_'.
fn is_label_value(value: &str) -> bool {
    value.len() <= 63 && value.bytes().all(is_label_byte)
}

fn is_label_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'
}

pub(super) fn check_labels(batch: &Batch, v: &mut Violations) {
    const MAX: usize = 32;
    if batch.labels.len() > MAX {
        v.invalid(
            "labels",
            format!(
                "{} labels given; at most {MAX} are accepted",
                batch.labels.len()
            ),
        );
        return;
    }
    for (key, value) in &batch.labels {
        if !is_label_key(key) {
            v.invalid(
                format!("labels[{}]", quote(key).trim_matches('"')),
                format!("label key {} is invalid: {LABEL_KEY_RULE}", quote(key)),
            );
        }
        if !is_label_value(value) {
            v.invalid(
                format!("labels[{}]", quote(key).trim_matches('"')),
                format!(
                    "label value {} is invalid: empty or up to 63 characters of lowercase letters, digits, '-' and '_'",
                    quote(value)
                ),
            );
        }
    }
}
