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
    ("gpu", 1),
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

/// Imports between sibling files that the circle test below does not
/// count: (folder, from, to), each closing a circle still left. None is:
/// the last ones (the OpenAPI document naming every REST handler) went
/// when the routes came to be declared once, in `server/routes.rs`.
const IMPORTS_LEFT: &[(&str, &str, &str)] = &[];

/// A file's module path from the crate root: `src/scheduler/core.rs` is
/// `scheduler::core`, `src/scheduler/mod.rs` is `scheduler`.
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).expect("a file under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let name = parts.pop().expect("a file name");
    let stem = name.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// Every `.rs` file of the library crate but `main.rs` (its own crate)
/// and unit tests (`tests.rs`, `tests/`: a test may take its fixture from
/// anywhere).
fn library_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![src()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && path != src().join("main.rs")
                && !path.iter().any(|p| p == "tests" || p == "tests.rs")
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Whether the folder of module `folder` has a file (or folder) `name`.
fn has_child(folder: &[String], name: &str) -> bool {
    let dir = folder.iter().fold(src(), |d, p| d.join(p));
    dir.join(format!("{name}.rs")).is_file() || dir.join(name).join("mod.rs").is_file()
}

/// The code of a file as (line number, line): comments dropped, and
/// inline modules (`mod tests { .. }`) left out, since their `super::`
/// is the file itself.
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut inline_module = false;
    for (n, line) in text.lines().enumerate() {
        if inline_module {
            inline_module = line != "}";
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let mod_at = words.iter().position(|w| *w == "mod");
        if !line.starts_with(' ') && mod_at.is_some() && line.trim_end().ends_with('{') {
            inline_module = true;
            continue;
        }
        let code = line.split("//").next().unwrap_or("");
        out.push((n + 1, code.to_string()));
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Reads a path at `text[i..]` whose segments so far are `prefix`: its
/// idents joined by `::`, a braced list read as one path per item, `self`
/// in a list as the list's own prefix. Pushes each whole path to `out`
/// and returns where the path ends.
fn read_path(
    text: &[char],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        while text.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        if text.get(i) == Some(&'{') {
            i += 1;
            loop {
                while text.get(i).is_some_and(|c| c.is_whitespace() || *c == ',') {
                    i += 1;
                }
                match text.get(i) {
                    None => return i,
                    Some('}') => return i + 1,
                    _ => {}
                }
                let before = i;
                i = read_path(text, i, prefix.clone(), out);
                // Skip what the list item has after its path (`as x`).
                while text.get(i).is_some_and(|c| *c != ',' && *c != '}') {
                    i += 1;
                }
                if i == before {
                    i += 1;
                }
            }
        }
        let start = i;
        while text.get(i).is_some_and(|c| is_ident(*c)) {
            i += 1;
        }
        let segment: String = text[start..i].iter().collect();
        if !segment.is_empty() && segment != "self" {
            prefix.push(segment);
        }
        if text.get(i) == Some(&':') && text.get(i + 1) == Some(&':') {
            i += 2;
        } else {
            out.push(prefix);
            return i;
        }
    }
}

/// The absolute paths a file of module `here` names through `crate::`,
/// `super::` and `self::`, with their line numbers. Read over the whole
/// text, so a `use` list over several lines counts whole.
fn named_paths(text: &str, here: &[String]) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut chars: Vec<char> = Vec::new();
    let mut line_of: Vec<usize> = Vec::new();
    for (n, line) in code_lines(text) {
        for c in line.chars().chain(['\n']) {
            chars.push(c);
            line_of.push(n);
        }
    }
    let mut i = 0;
    while i < chars.len() {
        let boundary =
            i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == '$' || chars[i - 1] == ':');
        let rest: String = chars[i..chars.len().min(i + 7)].iter().collect();
        let root = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|r| rest.starts_with(r));
        let (Some(root), true) = (root, boundary) else {
            i += 1;
            continue;
        };
        let line = line_of[i];
        let mut base: Vec<String> = match root {
            "crate::" => Vec::new(),
            "self::" => here.to_vec(),
            _ => here[..here.len().saturating_sub(1)].to_vec(),
        };
        i += root.len();
        while chars[i..].starts_with(&['s', 'u', 'p', 'e', 'r', ':', ':']) {
            base.pop();
            i += "super::".len();
        }
        let mut paths = Vec::new();
        i = read_path(&chars, i, base, &mut paths);
        out.extend(paths.into_iter().map(|p| (line, p)));
    }
    out
}

/// The items a file declares at its top level (`pub struct X`, `fn f`,
/// …): what a glob re-export of it (`pub use file::*`) names.
fn top_level_items(text: &str) -> Vec<String> {
    const KINDS: &[&str] = &[
        "struct", "enum", "fn", "type", "const", "static", "trait", "mod", "union",
    ];
    let mut out = Vec::new();
    for (_, line) in code_lines(text) {
        if line.starts_with(' ') || line.starts_with('}') {
            continue;
        }
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == '(' || c == '<' || c == ':' || c == ';')
            .filter(|w| !w.is_empty())
            .collect();
        if let Some(k) = words.iter().position(|w| KINDS.contains(w)) {
            if let Some(name) = words.get(k + 1) {
                out.push(name.to_string());
            }
        }
    }
    out
}

/// What a folder's `mod.rs` re-exports from its files: item name → file.
fn reexports(folder: &[String]) -> BTreeMap<String, String> {
    let dir = folder.iter().fold(src(), |d, p| d.join(p));
    let head = if folder.is_empty() {
        "lib.rs"
    } else {
        "mod.rs"
    };
    let Ok(text) = std::fs::read_to_string(dir.join(head)) else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    let chars: Vec<char> = text.chars().collect();
    let code: String = chars.iter().collect();
    for (at, _) in code.match_indices("pub use ") {
        let mut paths = Vec::new();
        let start = code[..at].chars().count() + "pub use ".len();
        read_path(&chars, start, Vec::new(), &mut paths);
        for path in paths {
            if let (Some(file), Some(item)) = (path.first(), path.last())
                && path.len() > 1
                && has_child(folder, file)
            {
                out.insert(item.clone(), file.clone());
            }
        }
    }
    // `pub use file::*`: every item the file declares.
    for line in text.lines() {
        let Some(file) = line
            .trim()
            .strip_prefix("pub use ")
            .and_then(|r| r.strip_suffix("::*;"))
        else {
            continue;
        };
        if !has_child(folder, file) {
            continue;
        }
        let path = dir.join(format!("{file}.rs"));
        let path = if path.is_file() {
            path
        } else {
            dir.join(file).join("mod.rs")
        };
        let items = std::fs::read_to_string(path).unwrap_or_default();
        for item in top_level_items(&items) {
            out.entry(item).or_insert_with(|| file.to_string());
        }
    }
    out
}

/// The imports between sibling files: folder → (from, to) → where.
fn sibling_imports() -> BTreeMap<Vec<String>, BTreeMap<(String, String), String>> {
    let mut edges: BTreeMap<Vec<String>, BTreeMap<(String, String), String>> = BTreeMap::new();
    let mut reexported: BTreeMap<Vec<String>, BTreeMap<String, String>> = BTreeMap::new();
    for file in library_files() {
        let here = module_path(&file);
        let text = std::fs::read_to_string(&file).expect("read file");
        for (line, path) in named_paths(&text, &here) {
            let d = here.iter().zip(&path).take_while(|(a, b)| a == b).count();
            if d >= here.len() || d >= path.len() {
                continue;
            }
            let folder = here[..d].to_vec();
            let to = if has_child(&folder, &path[d]) {
                path[d].clone()
            } else {
                let names = reexported
                    .entry(folder.clone())
                    .or_insert_with(|| reexports(&folder));
                match names.get(&path[d]) {
                    Some(file) => file.clone(),
                    None => continue,
                }
            };
            if to == here[d] {
                continue;
            }
            edges
                .entry(folder)
                .or_default()
                .entry((here[d].clone(), to))
                .or_insert_with(|| {
                    format!(
                        "{}:{line} names {}",
                        file.strip_prefix(src()).unwrap_or(&file).display(),
                        path.join("::")
                    )
                });
        }
    }
    edges
}

/// Each circle of a folder's imports, as its files in order (the first
/// again at the end), with where each import is.
fn circles(edges: &BTreeMap<(String, String), String>) -> Vec<(Vec<String>, Vec<String>)> {
    // The shortest way from `a` to `b`, by breadth first.
    let way = |a: &String, b: &String| -> Option<Vec<String>> {
        let mut came: BTreeMap<&String, &String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([a]);
        while let Some(n) = queue.pop_front() {
            for (from, to) in edges.keys().filter(|(from, _)| from == n) {
                if came.contains_key(to) || to == a {
                    continue;
                }
                came.insert(to, from);
                if to == b {
                    let mut path = vec![b.clone()];
                    let mut at = b;
                    while at != a {
                        at = came[at];
                        path.push(at.clone());
                    }
                    path.reverse();
                    return Some(path);
                }
                queue.push_back(to);
            }
        }
        None
    };
    let mut seen: Vec<Vec<String>> = Vec::new();
    let mut out = Vec::new();
    for (a, b) in edges.keys() {
        let Some(back) = way(b, a) else { continue };
        let mut members = back.clone();
        members.sort();
        if seen.contains(&members) {
            continue;
        }
        seen.push(members);
        let mut circle = vec![a.clone()];
        circle.extend(back);
        let wheres = circle
            .windows(2)
            .map(|w| edges[&(w[0].clone(), w[1].clone())].clone())
            .collect();
        out.push((circle, wheres));
    }
    out
}

#[test]
fn no_file_imports_a_sibling_that_imports_it_back() {
    let mut found = Vec::new();
    let all = sibling_imports();
    for (folder, from, to) in IMPORTS_LEFT {
        let folder: Vec<String> = folder.split('/').skip(1).map(String::from).collect();
        assert!(
            all.get(&folder)
                .is_some_and(|e| e.contains_key(&(from.to_string(), to.to_string()))),
            "IMPORTS_LEFT names an import that is gone: {from} → {to}; drop it"
        );
    }
    for (folder, mut edges) in all {
        let name = if folder.is_empty() {
            "src".to_string()
        } else {
            format!("src/{}", folder.join("/"))
        };
        edges.retain(|(from, to), _| !IMPORTS_LEFT.contains(&(name.as_str(), from, to)));
        for (circle, wheres) in circles(&edges) {
            found.push(format!(
                "{name}: {} ({})",
                circle.join(" → "),
                wheres.join("; ")
            ));
        }
    }
    assert!(
        found.is_empty(),
        "import circles between the files of a folder (move the shared item to the file \
         that owns it, or to a lower one):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_circle_reader_reads_lists_over_several_lines_and_globbed_items() {
    let here = ["spec".to_string(), "alternatives".to_string()];
    let got: Vec<String> = named_paths(
        "use super::{\n    request::ClusterRequest,\n    shape::Accelerator,\n};\n",
        &here,
    )
    .into_iter()
    .map(|(n, p)| format!("{n}:{}", p.join("::")))
    .collect();
    assert_eq!(
        got,
        [
            "1:spec::request::ClusterRequest",
            "1:spec::shape::Accelerator"
        ]
    );
    assert_eq!(
        top_level_items(
            "pub struct A {\n    x: u8,\n}\npub(crate) fn b() {}\nimpl A {\n    pub fn c() {}\n}\n"
        ),
        ["A", "b"]
    );
}

#[test]
fn the_circle_reader_resolves_paths() {
    let here = ["scheduler".to_string(), "core".to_string()];
    let got: Vec<String> = named_paths(
        "use super::{layout::Declared, model::{self, A}};\n\
         use crate::spec::X; // crate::not::this\n\
         fn f() { super::super::engine::g(); $crate::no(); Self::no(); }\n\
         mod tests {\n    use super::*;\n}\n",
        &here,
    )
    .into_iter()
    .map(|(n, p)| format!("{n}:{}", p.join("::")))
    .collect();
    assert_eq!(
        got,
        [
            "1:scheduler::layout::Declared",
            "1:scheduler::model",
            "1:scheduler::model::A",
            "2:spec::X",
            "3:engine::g",
        ]
    );
}
