//! The shape stays: every module imports only the layers below it
//! (docs/architecture.md) and nothing but the store imports sqlx. (That
//! nothing outside the engine takes the scheduler core's lock the compiler
//! checks: the lock is private to `engine`.)
//!
//! It reads `src/` as text: each top-level module's `crate::NAME` paths
//! (in `use` lists too) must name a module of the same or a lower rank.
//! Unit-test files (`tests.rs`) are skipped: a test may build its fixture
//! from any layer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Bottom up; a module may import modules of its rank or below.
const RANKS: &[(&str, u32)] = &[
    ("api", 0),
    ("stats", 0),
    ("spec", 1),
    ("scheduler", 2),
    ("launch", 2),
    ("protocol", 3),
    ("config", 3),
    ("telemetry", 3),
    ("metrics", 3),
    ("store", 4),
    ("simulate", 4),
    ("engine", 5),
    ("server", 7),
    ("grpc", 6),
    ("agent", 8),
    ("cli", 8),
];

/// Imports still not allowed, though the ranks would.
const FORBIDDEN: &[(&str, &str)] = &[
    // Front ends call the engine's use cases; they never read or write
    // the store themselves (`cli` may: `flexq migrate` runs migrations).
    ("server", "store"),
    ("grpc", "store"),
    ("agent", "store"),
    ("store", "metrics"),
    ("scheduler", "launch"),
    // The simulator is pure: no database, no metrics of the live process.
    ("simulate", "store"),
    ("simulate", "metrics"),
    ("simulate", "telemetry"),
];

fn rank(module: &str) -> Option<u32> {
    RANKS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file of a top-level module, but unit-test files.
fn files_of(module: &str) -> Vec<PathBuf> {
    let dir = src().join(module);
    let mut out = Vec::new();
    if dir.is_dir() {
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).expect("read src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs")
                    && path.file_name().is_some_and(|n| n != "tests.rs")
                {
                    out.push(path);
                }
            }
        }
    } else {
        out.push(src().join(format!("{module}.rs")));
    }
    out
}

/// The top-level modules a file names through `crate::`, including those
/// in `use crate::{a, b::c}` lists.
fn imports(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            // A braced list: its first-level names.
            let mut depth = 0;
            let mut item = String::new();
            for c in list.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(head(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                // Inside a nested list only the path before it counts.
                if depth == 0 || !item.contains(':') {
                    item.push(c);
                }
            }
            out.push(head(&item));
        } else {
            out.push(head(rest));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

fn head(path: &str) -> String {
    path.trim()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn every_module_imports_only_layers_below_it() {
    let mut wrong: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (module, own) in RANKS {
        for file in files_of(module) {
            let text = std::fs::read_to_string(&file).expect("read file");
            for used in imports(&text) {
                if used == *module {
                    continue;
                }
                let Some(theirs) = rank(&used) else {
                    // `crate::` followed by something that is not a module
                    // of the table (a macro's `$crate`, a doc example).
                    continue;
                };
                if theirs > *own || FORBIDDEN.contains(&(*module, used.as_str())) {
                    wrong
                        .entry(format!("{} ({module})", file.display()))
                        .or_default()
                        .push(used);
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports of a layer above (see docs/architecture.md): {wrong:#?}"
    );
}

#[test]
fn every_top_level_module_has_a_rank() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    for line in lib.lines() {
        if let Some(name) = line.strip_prefix("pub mod ").or(line.strip_prefix("mod ")) {
            let name = name.trim_end_matches(';').trim();
            assert!(
                rank(name).is_some(),
                "module {name} is not in the architecture test's table"
            );
        }
    }
}

#[test]
fn only_the_store_uses_sqlx() {
    for (module, _) in RANKS.iter().filter(|(m, _)| *m != "store") {
        for file in files_of(module) {
            let text = std::fs::read_to_string(&file).expect("read file");
            assert!(
                !text.contains("sqlx::") && !text.contains("use sqlx"),
                "{} uses sqlx; only the store may",
                file.display()
            );
        }
    }
}

/// `Engine::store()` is public for benchmarks and tools; a front end
/// reaching the store through it would bypass the use cases.
#[test]
fn front_ends_never_reach_the_store_through_the_engine() {
    for module in ["server", "grpc", "agent", "cli"] {
        for file in files_of(module) {
            let text = std::fs::read_to_string(&file).expect("read file");
            assert!(
                !text.contains(".store()"),
                "{} calls .store(); front ends call the engine's use cases",
                file.display()
            );
        }
    }
}

#[test]
fn the_import_reader_sees_braced_lists() {
    let got =
        imports("use crate::{api::State, spec::{self, Policy}};\nfn f() { crate::store::x(); }");
    assert_eq!(got, ["api", "spec", "store"]);
}
