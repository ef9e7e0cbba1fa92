//! What a reload may change: the live sections against the restart-only
//! ones ([`RESTART_ONLY`]), the live part as JSON and its digest (what
//! every replica applies), a loaded config with another's live part
//! ([`Config::with_live`]), and what replacing one config by another
//! changes, key by key ([`Config::changes`]).

use std::collections::BTreeMap;

use serde::Serialize;

use super::check::invalid;
use super::{Config, ConfigError};

/// Sections a reload cannot change: they are read at start only (the
/// listeners, the database, logging). Every other section is live.
pub const RESTART_ONLY: &[&str] = &["server", "database", "log"];

/// One key a reload changes: its dotted name and its values before and
/// after (as JSON text; none where the key is absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyChange {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

impl Config {
    /// The live sections (all but [`RESTART_ONLY`]) as JSON: what every
    /// replica applies, and what the config's digest is of.
    pub fn live_value(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = value.as_object_mut() {
            for section in RESTART_ONLY {
                map.remove(*section);
            }
        }
        value
    }

    /// The SHA-256 of [`Config::live_value`], in hex (keys sorted, so equal
    /// configs have equal digests).
    pub fn digest(&self) -> String {
        use sha2::Digest;
        let text = self.live_value().to_string();
        sha2::Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// `live` (another config's [`Config::live_value`]) with this config's
    /// restart-only sections, checked as a whole.
    pub fn with_live(&self, live: &serde_json::Value) -> Result<Config, ConfigError> {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let (Some(map), Some(sections)) = (value.as_object_mut(), live.as_object()) {
            map.retain(|k, _| RESTART_ONLY.contains(&k.as_str()));
            for (k, v) in sections {
                if !RESTART_ONLY.contains(&k.as_str()) {
                    map.insert(k.clone(), v.clone());
                }
            }
        }
        let config: Config = serde_path_to_error::deserialize(value)
            .map_err(|e| invalid(e.path().to_string(), e.inner().to_string()))?;
        config.check()?;
        Ok(config)
    }

    /// What replacing `self` by `next` changes, key by key in name order:
    /// the live keys, then the restart-only ones (which a reload leaves as
    /// they are until the next start).
    pub fn changes(&self, next: &Config) -> (Vec<KeyChange>, Vec<KeyChange>) {
        let (mut old, mut new) = (BTreeMap::new(), BTreeMap::new());
        flatten(
            "",
            &serde_json::to_value(self).unwrap_or_default(),
            &mut old,
        );
        flatten(
            "",
            &serde_json::to_value(next).unwrap_or_default(),
            &mut new,
        );
        let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
        let (mut live, mut restart) = (Vec::new(), Vec::new());
        for key in keys {
            let (from, to) = (old.get(key), new.get(key));
            if from == to {
                continue;
            }
            let secret = key == "database.url";
            let show = |v: Option<&String>| {
                v.map(|v| {
                    if secret {
                        "\"(redacted)\"".to_string()
                    } else {
                        v.clone()
                    }
                })
            };
            let change = KeyChange {
                key: key.clone(),
                from: show(from),
                to: show(to),
            };
            let section = key.split(['.', '[']).next().unwrap_or_default();
            if RESTART_ONLY.contains(&section) {
                restart.push(change);
            } else {
                live.push(change);
            }
        }
        (live, restart)
    }
}

/// Leaves of a JSON value as dotted keys (`regions.r.zones.z…`, arrays as
/// `quotas[0].limit`), each with its value as JSON text.
fn flatten(prefix: &str, value: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match value {
        serde_json::Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        serde_json::Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), v, out);
            }
        }
        leaf => {
            out.insert(prefix.to_string(), leaf.to_string());
        }
    }
}
