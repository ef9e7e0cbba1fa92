//! RAPIDS CPU fallback (docs/rules.md#gpu-telemetry): with
//! `spark.rapids.sql.explain=NOT_ON_GPU` the RAPIDS Accelerator writes to
//! the driver's log each operator or expression of a plan that cannot run
//! on the GPU, one line each, as
//! `! <SortExec> cannot run on GPU because …`,
//! `!Exec <ProjectExec> cannot run on GPU because …` or
//! `!Expression <Concat> concat(a, b) cannot run on GPU because …`
//! (after the log's own prefix). [`FallbackCounter`] reads the driver's
//! output line by line and keeps the count and the first reasons.

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

/// Reads a driver's output, a chunk at a time (lines may span chunks).
#[derive(Debug, Default)]
pub struct FallbackCounter {
    partial: String,
    found: CpuFallback,
}

impl FallbackCounter {
    pub fn feed(&mut self, chunk: &str) {
        self.partial.push_str(chunk);
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            self.line(&line);
        }
        // A line longer than any RAPIDS writes is not one of its lines.
        if self.partial.len() > 64 * 1024 {
            self.partial.clear();
        }
    }

    fn line(&mut self, line: &str) {
        let Some(at) = line.find(MARK) else {
            return;
        };
        let head = &line[..at];
        // Its mark: `!` before the operator, after any log prefix.
        let Some(bang) = head.rfind('!') else {
            return;
        };
        let operator = head[bang..]
            .find('<')
            .and_then(|open| {
                let rest = &head[bang + open..];
                rest.find('>').map(|close| &rest[..=close])
            })
            .unwrap_or("<?>");
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
        let rest = std::mem::take(&mut self.partial);
        self.line(&rest);
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
        assert_eq!(f.operators, 4);
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
}
