//! Resource names: `projects/{p}/locations/{r}/batches/{id}` and
//! `projects/{p}/regions/{r}/operations/{uuid}`, and the rules for the ids a
//! client may choose.

use std::fmt;
use std::sync::LazyLock;

use regex::Regex;

static BATCH_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z0-9][-a-z0-9]{2,61}[a-z0-9]$").expect("static regex"));
static REQUEST_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-zA-Z0-9_-]{1,40}$").expect("static regex"));

/// Checks a client-chosen batch id: 4–63 characters,
/// `^[a-z0-9][-a-z0-9]{2,61}[a-z0-9]$`. The error is the description of a
/// field violation.
pub fn check_batch_id(id: &str) -> Result<(), String> {
    if BATCH_ID.is_match(id) {
        Ok(())
    } else {
        Err(format!(
            "batchId {} is invalid: use 4 to 63 characters of lowercase letters, digits and '-', starting and ending with a letter or digit (^[a-z0-9][-a-z0-9]{{2,61}}[a-z0-9]$)",
            quote(id)
        ))
    }
}

/// Checks a `requestId`: at most 40 characters of `[a-zA-Z0-9_-]`.
pub fn check_request_id(id: &str) -> Result<(), String> {
    if REQUEST_ID.is_match(id) {
        Ok(())
    } else {
        Err(format!(
            "requestId {} is invalid: use 1 to 40 characters of letters, digits, '_' and '-'",
            quote(id)
        ))
    }
}

/// A value quoted for an error message, shortened and with control
/// characters escaped, so hostile input cannot flood or forge a log line.
pub fn quote(value: &str) -> String {
    const MAX: usize = 80;
    let mut out = String::from("\"");
    for (i, c) in value.chars().enumerate() {
        if i == MAX {
            out.push_str(&format!("…\" ({} characters)", value.chars().count()));
            return out;
        }
        out.extend(c.escape_debug());
    }
    out.push('"');
    out
}

/// `projects/{project}/locations/{region}/batches/{batch_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BatchName {
    pub project: String,
    pub region: String,
    pub batch_id: String,
}

impl BatchName {
    pub fn new(project: &str, region: &str, batch_id: &str) -> BatchName {
        BatchName {
            project: project.to_string(),
            region: region.to_string(),
            batch_id: batch_id.to_string(),
        }
    }

    /// Parses a full resource name, `projects/P/locations/R/batches/ID`
    /// (or `regions/R`: [`is_region_collection`]).
    pub fn parse(name: &str) -> Option<BatchName> {
        let (project, region, batch_id) = parse_in_region(name, "batches")?;
        Some(BatchName {
            project,
            region,
            batch_id,
        })
    }
}

/// Whether a name's segment names a region. Dataproc's names spell it both
/// ways — batches `projects/P/locations/R/...`, operations
/// `projects/P/regions/R/...` — and clients mix them (Airflow's
/// DataprocHook creates and lists batches under `projects/P/regions/R`),
/// so a name given to flexq may use either; names flexq gives use the
/// spelling of their kind.
pub fn is_region_collection(segment: &str) -> bool {
    segment == "locations" || segment == "regions"
}

/// The project and region of `projects/P/{locations|regions}/R`.
pub fn parse_region_parent(text: &str) -> Option<(String, String)> {
    match text.split('/').collect::<Vec<_>>().as_slice() {
        ["projects", p, c, r] if is_region_collection(c) && !p.is_empty() && !r.is_empty() => {
            Some((p.to_string(), r.to_string()))
        }
        _ => None,
    }
}

/// The project, region and id of `projects/P/{locations|regions}/R/{kind}/ID`.
fn parse_in_region(text: &str, kind: &str) -> Option<(String, String, String)> {
    match text.split('/').collect::<Vec<_>>().as_slice() {
        ["projects", p, c, r, k, id]
            if is_region_collection(c)
                && *k == kind
                && !p.is_empty()
                && !r.is_empty()
                && !id.is_empty() =>
        {
            Some((p.to_string(), r.to_string(), id.to_string()))
        }
        _ => None,
    }
}

impl fmt::Display for BatchName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "projects/{}/locations/{}/batches/{}",
            self.project, self.region, self.batch_id
        )
    }
}

/// `projects/{project}/regions/{region}/operations/{operation_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OperationName {
    pub project: String,
    pub region: String,
    pub operation_id: String,
}

impl OperationName {
    /// Parses `projects/P/regions/R/operations/ID` (or `locations/R`).
    pub fn parse(name: &str) -> Option<OperationName> {
        let (project, region, operation_id) = parse_in_region(name, "operations")?;
        Some(OperationName {
            project,
            region,
            operation_id,
        })
    }
}

impl fmt::Display for OperationName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "projects/{}/regions/{}/operations/{}",
            self.project, self.region, self.operation_id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids_follow_the_published_pattern() {
        for ok in ["abcd", "a-0-b", "0abc", &"a".repeat(63)] {
            assert!(check_batch_id(ok).is_ok(), "{ok}");
        }
        for bad in [
            "abc",
            "-abc",
            "abc-",
            "ABCD",
            "ab_cd",
            "abcé",
            "ab\ncd",
            &"a".repeat(64),
            "",
        ] {
            let err = check_batch_id(bad).expect_err(bad);
            assert!(err.contains("4 to 63"), "{err}");
        }
    }

    #[test]
    fn request_ids_allow_40_characters_of_a_small_alphabet() {
        assert!(check_request_id("Req_1-x").is_ok());
        assert!(check_request_id(&"r".repeat(40)).is_ok());
        assert!(check_request_id(&"r".repeat(41)).is_err());
        assert!(check_request_id("a b").is_err());
        assert!(check_request_id("").is_err());
    }

    #[test]
    fn quoting_escapes_control_characters_and_truncates() {
        assert_eq!(quote("a\nb"), "\"a\\nb\"");
        let long = quote(&"x".repeat(100_000));
        assert!(long.len() < 120, "{long}");
        assert!(long.ends_with("(100000 characters)"));
    }

    #[test]
    fn names_round_trip() {
        let name = BatchName::new("p", "r", "b-1");
        assert_eq!(BatchName::parse(&name.to_string()), Some(name));
        assert_eq!(
            BatchName::parse("projects/p/regions/r/batches/b"),
            Some(BatchName::new("p", "r", "b")),
            "the other spelling of a region"
        );
        for bad in [
            "projects/p/zones/r/batches/b",
            "projects/p/locations/r/batches/",
            "projects//locations/r/batches/b",
            "projects/p/locations/r/operations/b",
            "",
        ] {
            assert!(BatchName::parse(bad).is_none(), "{bad}");
        }
        let op = OperationName::parse("projects/p/locations/r/operations/o").expect("operation");
        assert_eq!(op.to_string(), "projects/p/regions/r/operations/o");
        assert_eq!(
            parse_region_parent("projects/p/regions/r"),
            Some(("p".into(), "r".into()))
        );
        assert!(parse_region_parent("projects/p/regions").is_none());
    }
}
