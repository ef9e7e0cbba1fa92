//! What a failed driver's output says went wrong, in one or two lines for
//! the batch's `stateMessage`: the error a person would scroll for, not the
//! last line of a log (which is usually Spark shutting down).

/// Patterns of known causes, most specific first: (marker, label).
const CAUSES: &[(&str, &str)] = &[
    ("GpuOutOfMemory", "GPU out of memory"),
    ("RetryOOM", "GPU out of memory"),
    ("CUDA error: out of memory", "GPU out of memory"),
    ("RmmException", "GPU out of memory"),
    ("java.lang.OutOfMemoryError", "out of memory"),
    ("ClassNotFoundException", "missing library"),
    ("NoClassDefFoundError", "missing library"),
    ("ModuleNotFoundError", "missing library"),
    ("UnsatisfiedLinkError", "missing library"),
    ("PATH_NOT_FOUND", "missing file"),
    ("FileNotFoundException", "missing file"),
    ("No such file or directory", "missing file"),
    ("does not exist", "missing file"),
];

fn is_noise(line: &str) -> bool {
    let l = line.trim();
    l.is_empty()
        || l.starts_with("at ")
        || l.starts_with("...")
        || [" INFO ", " WARN ", " DEBUG "]
            .iter()
            .any(|lvl| l.contains(lvl))
}

/// The Python exception that ended a traceback: the last line after the
/// last `Traceback (most recent call last):` that names an exception.
fn python_exception(lines: &[&str]) -> Option<String> {
    let start = lines
        .iter()
        .rposition(|l| l.starts_with("Traceback (most recent call last):"))?;
    lines[start + 1..]
        .iter()
        .find(|l| !l.starts_with(char::is_whitespace) && !l.trim().is_empty())
        .map(|l| l.trim().to_string())
}

/// The Java exception of the main thread, if the driver died of one.
fn java_exception(lines: &[&str]) -> Option<String> {
    lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("Exception in thread \"main\" "))
        .map(|l| l.trim().to_string())
}

fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// A one-paragraph account of a failed driver from the tail of its output:
/// the cause when one is recognised (GPU out of memory, missing file or
/// library), the exception, else the last meaningful lines.
pub fn failure_summary(output: &str) -> String {
    let lines: Vec<&str> = output.lines().collect();
    let exception = python_exception(&lines).or_else(|| java_exception(&lines));
    let cause = CAUSES.iter().find_map(|(marker, label)| {
        lines
            .iter()
            .rev()
            .find(|l| l.contains(marker) && !l.contains(" INFO "))
            .map(|l| (*label, l.trim()))
    });
    let text = match (cause, exception) {
        (Some((label, _)), Some(e)) => format!("{label}: {e}"),
        (Some((label, line)), None) => format!("{label}: {line}"),
        (None, Some(e)) => e,
        (None, None) => {
            let last: Vec<&str> = lines
                .iter()
                .rev()
                .filter(|l| !is_noise(l))
                .take(3)
                .copied()
                .collect();
            last.into_iter().rev().collect::<Vec<_>>().join(" | ")
        }
    };
    clip(&text, 1500)
}
