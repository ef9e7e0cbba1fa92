//! RAPIDS CPU fallback (docs/rules.md#gpu-telemetry): with
//! `spark.rapids.sql.explain=NOT_ON_GPU` the RAPIDS Accelerator writes to
//! the driver's log each operator or expression of a plan that cannot run
//! on the GPU, one line each, as
//! `! <SortExec> cannot run on GPU because …`,
//! `!Exec <ProjectExec> cannot run on GPU because …` or
//! `!Expression <Concat> concat(a, b) cannot run on GPU because …`
//! (after the log's own prefix). [`FallbackCounter`] reads the driver's
//! output line by line, each stream's lines apart (stdout and stderr come
//! interleaved, a chunk at a time), and keeps the count of distinct such
//! lines and the first reasons. Real logs it is tested on:
//! `testdata/rapids/`.

pub use crate::api::CpuFallback;

/// The explain setting the agent gives a batch that runs with RAPIDS,
/// unless the batch set it itself.
pub const EXPLAIN_KEY: &str = "spark.rapids.sql.explain";
pub const EXPLAIN_VALUE: &str = "NOT_ON_GPU";

/// How many distinct reasons a batch keeps.
pub const MAX_REASONS: usize = 5;

/// Longest reason kept, in bytes.
const MAX_REASON_BYTES: usize = 300;

const MARK: &str = " cannot run on GPU because ";

/// Distinct fallback lines remembered, to count a plan logged again once;
/// past this many, every further line counts.
const MAX_SEEN: usize = 10_000;

/// Which of the driver's streams a chunk was read from: each has its own
/// partial line, so a line split across reads of stderr is whole again
/// however many stdout chunks came between its pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout = 0,
    Stderr = 1,
}

/// Longest partial line kept: a line longer than any RAPIDS writes is not
/// one of its lines.
const MAX_PARTIAL_BYTES: usize = 64 * 1024;

/// Reads a driver's output, a chunk at a time (lines, and characters, may
/// span chunks; stdout and stderr chunks may interleave). Each operator
/// counts once however often its plan is logged (Spark plans a query
/// again and the Accelerator logs each plan).
#[derive(Debug, Default)]
pub struct FallbackCounter {
    /// The unfinished last line of stdout and of stderr.
    partial: [Vec<u8>; 2],
    found: CpuFallback,
    seen: std::collections::HashSet<String>,
}

/// Where a tree line's mark is: the first `!` followed by an operation
/// name (maybe empty) and ` <`, after any log prefix. An `!` inside the
/// expression's text (`a != b`) comes after it.
fn mark_at(head: &str) -> Option<usize> {
    head.match_indices('!').map(|(i, _)| i).find(|&i| {
        let rest = head[i + 1..].trim_start_matches(|c: char| c.is_ascii_alphabetic() || c == '_');
        rest.starts_with(" <")
    })
}

impl FallbackCounter {
    /// A chunk of a single stream's output (as [`Stream::Stdout`]).
    pub fn feed(&mut self, chunk: &str) {
        self.feed_from(Stream::Stdout, chunk.as_bytes());
    }

    /// A chunk read from `stream`, as it came (not necessarily whole lines
    /// or whole UTF-8 characters).
    pub fn feed_from(&mut self, stream: Stream, chunk: &[u8]) {
        let mut buf = std::mem::take(&mut self.partial[stream as usize]);
        buf.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(n) = buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + n + 1;
            self.line(&String::from_utf8_lossy(&buf[start..end]));
            start = end;
        }
        buf.drain(..start);
        if buf.len() > MAX_PARTIAL_BYTES {
            buf.clear();
        }
        self.partial[stream as usize] = buf;
    }

    fn line(&mut self, line: &str) {
        let Some(at) = line.find(MARK) else {
            return;
        };
        let head = &line[..at];
        let Some(bang) = mark_at(head) else {
            return;
        };
        let operator = head[bang..]
            .find('<')
            .and_then(|open| {
                let rest = &head[bang + open..];
                rest.find('>').map(|close| &rest[..=close])
            })
            .unwrap_or("<?>");
        let tree_line = line[bang..].trim_end();
        if self.seen.len() < MAX_SEEN {
            if !self.seen.insert(tree_line.to_string()) {
                return;
            }
        } else if self.seen.contains(tree_line) {
            return;
        }
        self.found.operators += 1;
        let mut why = line[at + MARK.len()..].trim().to_string();
        if why.len() > MAX_REASON_BYTES {
            let mut cut = MAX_REASON_BYTES;
            while !why.is_char_boundary(cut) {
                cut -= 1;
            }
            why.truncate(cut);
            why.push('…');
        }
        let reason = format!("{operator}: {why}");
        if self.found.reasons.len() < MAX_REASONS && !self.found.reasons.contains(&reason) {
            self.found.reasons.push(reason);
        }
    }

    /// What was found so far (a last line without its newline included).
    pub fn finish(mut self) -> CpuFallback {
        for rest in std::mem::take(&mut self.partial) {
            self.line(&String::from_utf8_lossy(&rest));
        }
        self.found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written in the layout the RAPIDS Accelerator's explain output has
    /// (its documentation's and tests' examples), not recorded from a run
    /// with the jar: these machines have none.
    const LOG: &str = "\
25/12/03 10:00:01 INFO SparkContext: Running Spark version 4.0.0
25/12/03 10:00:09 WARN GpuOverrides: 
! <RowDataSourceScanExec> cannot run on GPU because GPU does not currently support the operator class org.apache.spark.sql.execution.RowDataSourceScanExec
  *Exec <ProjectExec> will run on GPU
25/12/03 10:00:10 WARN GpuOverrides: 
!Exec <SortExec> cannot run on GPU because not all expressions can be replaced
  !Expression <Concat> concat(c1#3, c2#4) cannot run on GPU because input expression AttributeReference c2#4 (StringType(UNICODE) is not supported)
!Exec <SortExec> cannot run on GPU because not all expressions can be replaced
";

    #[test]
    fn fallback_lines_are_counted_with_their_first_reasons_across_chunks() {
        let mut c = FallbackCounter::default();
        // Fed in pieces that split lines anywhere.
        for piece in LOG.as_bytes().chunks(37) {
            c.feed(std::str::from_utf8(piece).expect("ascii"));
        }
        let f = c.finish();
        // The repeated SortExec line counts once.
        assert_eq!(f.operators, 3);
        assert_eq!(
            f.reasons,
            [
                "<RowDataSourceScanExec>: GPU does not currently support the operator class org.apache.spark.sql.execution.RowDataSourceScanExec",
                "<SortExec>: not all expressions can be replaced",
                "<Concat>: input expression AttributeReference c2#4 (StringType(UNICODE) is not supported)",
            ]
        );
        assert!(!f.without_rapids);
        // Output with no fallback: nothing.
        let mut none = FallbackCounter::default();
        none.feed("*Exec <ProjectExec> will run on GPU\nok\n");
        assert_eq!(none.finish(), CpuFallback::default());
        // A last line without its newline is read at the end; at most
        // MAX_REASONS reasons are kept.
        let mut many = FallbackCounter::default();
        for i in 0..8 {
            many.feed(&format!(
                "!Exec <Op{i}> cannot run on GPU because reason {i}\n"
            ));
        }
        many.feed("! <Last> cannot run on GPU because no newline");
        let f = many.finish();
        assert_eq!(f.operators, 9);
        assert_eq!(f.reasons.len(), MAX_REASONS);
    }

    /// Counts the recorded logs of `testdata/rapids/` (see its README:
    /// published by users and maintainers, copied byte for byte).
    fn recorded(log: &str) -> CpuFallback {
        let mut c = FallbackCounter::default();
        for piece in log.as_bytes().chunks(61) {
            c.feed(&String::from_utf8_lossy(piece));
        }
        c.finish()
    }

    #[test]
    fn recorded_rapids_logs_are_counted_by_operator_with_their_reasons() {
        let cde = recorded(include_str!("testdata/rapids/cde-not-on-gpu.log"));
        assert_eq!(cde.operators, 2);
        assert_eq!(
            cde.reasons[0],
            "<ShuffleExchangeExec>: Columnar exchange without columnar children is inefficient"
        );
        assert!(cde.reasons[1].starts_with(
            "<FileSourceScanExec>: unsupported data types DecimalType(7,2) [cr_return_amount"
        ));
        assert!(cde.reasons[1].ends_with("GpuCSVScan only supports UTF8 encoded data"));

        // `! <Percentile>`: a class the Accelerator has no rule for.
        let percentile = recorded(include_str!("testdata/rapids/spark-rapids-6267.log"));
        assert_eq!(percentile.operators, 3);
        assert_eq!(
            percentile.reasons[1..],
            [
                "<ObjectHashAggregateExec>: not all expressions can be replaced",
                "<Percentile>: GPU does not currently support the operator class org.apache.spark.sql.catalyst.expressions.aggregate.Percentile",
            ]
        );

        // With explain=ALL: what runs on the GPU (`*`, `@`) is not counted.
        let join = recorded(include_str!("testdata/rapids/spark-rapids-3913.log"));
        assert_eq!(join.operators, 2);
        assert_eq!(
            join.reasons,
            [
                "<SortMergeJoinExec>: ExistenceJoin(exists#416) currently is not supported",
                "<SortMergeJoinExec>: ExistenceJoin(exists#415) currently is not supported",
            ]
        );

        // Behind a log collector's timestamps; at most MAX_REASONS kept.
        let dataproc = recorded(include_str!("testdata/rapids/dataproc-1282.log"));
        assert_eq!(dataproc.operators, 6);
        assert_eq!(dataproc.reasons.len(), MAX_REASONS);
        assert!(
            dataproc.reasons[0]
                .starts_with("<DecodeUsingSerializer>: GPU does not currently support")
        );
    }

    /// The driver's stderr (where Spark's log, and so the Accelerator's
    /// explain lines, go) read in chunks that split its lines (and a
    /// character), with stdout chunks (the job's own prints, one without
    /// its newline yet) read between them: every fallback line is counted
    /// with its reason, and nothing of stdout is glued into one.
    #[test]
    fn stderr_lines_split_across_chunks_interleaved_with_stdout_are_counted() {
        let err = "25/12/03 10:00:09 WARN GpuOverrides: \n\
! <RowDataSourceScanExec> cannot run on GPU because GPU does not currently support the operator class X\n\
!Exec <SortExec> cannot run on GPU because not all expressions can be replaced\n  \
!Expression <Concat> concat(a#1, b#2) cannot run on GPU because reason \u{e9}t\u{e9}\n\
!Exec <FilterExec> cannot run on GPU because the last one, no newline";
        let after = |s: &str| err.find(s).expect(s) + s.len();
        let cuts = [
            0,
            after("cannot run on GPU bec"),
            after("<Sor"),
            after("<Concat> con"),
            // Inside the two bytes of the first `\u{e9}`.
            err.find('\u{e9}').expect("\u{e9}") + 1,
            after("!Exec <Filter"),
            err.len(),
        ];
        let stdout = [
            "rows so far: 1000\n",
            "progress: 50% (no newline yet) ",
            "done\n",
            "stdout between the halves of \u{e9}\n",
            // Would make a fallback line if glued to stderr's partial one.
            "Exec> cannot run on GPU because of stdout\n",
        ];
        let mut c = FallbackCounter::default();
        for (k, piece) in cuts.windows(2).enumerate() {
            c.feed_from(Stream::Stderr, &err.as_bytes()[piece[0]..piece[1]]);
            if let Some(out) = stdout.get(k) {
                c.feed_from(Stream::Stdout, out.as_bytes());
            }
        }
        let f = c.finish();
        assert_eq!(f.operators, 4, "{f:?}");
        assert_eq!(
            f.reasons,
            [
                "<RowDataSourceScanExec>: GPU does not currently support the operator class X",
                "<SortExec>: not all expressions can be replaced",
                "<Concat>: reason \u{e9}t\u{e9}",
                "<FilterExec>: the last one, no newline",
            ]
        );
        // The same output read as one stream, whole: the same count.
        let mut whole = FallbackCounter::default();
        whole.feed(err);
        assert_eq!(whole.finish(), f);
    }

    #[test]
    fn a_plan_logged_again_counts_once_and_a_bang_in_an_expression_is_no_mark() {
        let log = include_str!("testdata/rapids/spark-rapids-6267.log");
        // Spark planned it again: the same tree, logged twice.
        assert_eq!(recorded(&format!("{log}\n{log}")).operators, 3);
        let f = recorded("!Expression <Not> NOT (a#1 != b#2) cannot run on GPU because reasons\n");
        assert_eq!(f.reasons, ["<Not>: reasons"]);
        // `!=` alone, with no mark before it: not a RAPIDS line.
        assert_eq!(
            recorded("where a != <b> cannot run on GPU because x\n").operators,
            0
        );
    }
}
