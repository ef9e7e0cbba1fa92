//! Reading the node's GPUs for telemetry (docs/rules.md#gpu-telemetry):
//! NVML (NVIDIA's management library, loaded at run time through the
//! `nvml-wrapper` crate), else `nvidia-smi`'s query mode, else nothing,
//! said once. Behind [`GpuReader`], so the sampling can be fed scripted
//! readings. The sampling loop ([`sample`]) makes a point per batch from
//! the GPUs its parts on this node hold, and uploads them
//! (`:telemetry`), keeping the latest `gpu::MAX_POINTS` of each batch
//! while the server cannot be reached.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::client::CallError;
use super::settings::GpuTelemetrySource;
use super::work::Ctx;
use crate::gpu::{GpuPoint, GpuReading, MAX_POINTS, point};
use crate::protocol::BatchGpuPoints;

/// Reads every GPU of the node once.
pub trait GpuReader: Send {
    /// What it reads through, for the log (`NVML`, `nvidia-smi`).
    fn source(&self) -> String;
    fn read(&mut self) -> Result<Vec<GpuReading>, String>;
}

/// NVML, through `nvml-wrapper` (the library is opened at run time).
pub struct NvmlReader {
    nvml: nvml_wrapper::Nvml,
}

impl NvmlReader {
    /// Opens NVML from `library` (the agent's `nvml_library`); empty: the
    /// system's (`libnvidia-ml.so.1`, found by the dynamic loader).
    pub fn open(library: &str) -> Result<NvmlReader, String> {
        let opened = if library.is_empty() {
            nvml_wrapper::Nvml::init()
        } else {
            nvml_wrapper::Nvml::builder()
                .lib_path(std::ffi::OsStr::new(library))
                .init()
        };
        let nvml = opened.map_err(|e| {
            if library.is_empty() {
                format!("NVML: {e}")
            } else {
                format!("NVML ({library}): {e}")
            }
        })?;
        let count = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
        if count == 0 {
            return Err("NVML: no GPU".into());
        }
        Ok(NvmlReader { nvml })
    }
}

impl GpuReader for NvmlReader {
    fn source(&self) -> String {
        "NVML".into()
    }

    fn read(&mut self) -> Result<Vec<GpuReading>, String> {
        let count = self.nvml.device_count().map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for i in 0..count {
            let device = self.nvml.device_by_index(i).map_err(|e| e.to_string())?;
            out.push(GpuReading {
                index: i.to_string(),
                utilization_percent: device.utilization_rates().ok().map(|u| f64::from(u.gpu)),
                memory_used_mb: device.memory_info().ok().map(|m| m.used / (1024 * 1024)),
            });
        }
        Ok(out)
    }
}

/// `nvidia-smi --query-gpu=index,utilization.gpu,memory.used
/// --format=csv,noheader,nounits`, killed after [`SMI_TIMEOUT`].
pub struct SmiReader {
    program: String,
    timeout: Duration,
}

/// How long one `nvidia-smi` query may take before it is killed.
pub const SMI_TIMEOUT: Duration = Duration::from_secs(10);

/// The query the `nvidia-smi` reader runs.
pub const SMI_ARGS: [&str; 2] = [
    "--query-gpu=index,utilization.gpu,memory.used",
    "--format=csv,noheader,nounits",
];

impl SmiReader {
    pub fn new(program: &str) -> SmiReader {
        SmiReader {
            program: program.to_string(),
            timeout: SMI_TIMEOUT,
        }
    }

    /// The same, killing a query that takes longer than `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> SmiReader {
        self.timeout = timeout;
        self
    }
}

impl GpuReader for SmiReader {
    fn source(&self) -> String {
        format!("{} (query mode)", self.program)
    }

    fn read(&mut self) -> Result<Vec<GpuReading>, String> {
        let mut child = std::process::Command::new(&self.program)
            .args(SMI_ARGS)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", self.program))?;
        let started = std::time::Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if started.elapsed() > self.timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "{} did not answer within {}",
                        self.program,
                        humantime::format_duration(self.timeout)
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(format!("{}: {e}", self.program)),
            }
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "{} exited with {}: {}",
                self.program,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        parse_smi_query(&String::from_utf8_lossy(&out.stdout))
    }
}

/// Parses the query's CSV: `index, utilization, memory used` per line,
/// with or without units and header; `[N/A]` and `[Not Supported]` are
/// no value.
pub fn parse_smi_query(text: &str) -> Result<Vec<GpuReading>, String> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with("index") {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [index, utilization, memory] = fields[..] else {
            return Err(format!(
                "expected `index, utilization.gpu, memory.used`, got {line:?}"
            ));
        };
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("not a GPU index: {index:?} in {line:?}"));
        }
        let value = |v: &str, unit: &str| -> Result<Option<f64>, String> {
            let v = v.trim_end_matches(unit).trim();
            if v.starts_with('[') || v.eq_ignore_ascii_case("N/A") {
                return Ok(None);
            }
            // `NaN` and `inf` parse as f64 but are no reading (a NaN
            // point would make the server refuse the whole upload).
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| format!("not a number: {v:?} in {line:?}"))
        };
        out.push(GpuReading {
            index: index.to_string(),
            utilization_percent: value(utilization, "%")?,
            memory_used_mb: value(memory, "MiB")?.map(|m| m.max(0.0) as u64),
        });
    }
    Ok(out)
}

/// The reader `setting` asks for, or None (said once, why) when there is
/// none on this node. Never fails the agent. `nvml_library`: where NVML
/// is loaded from; empty: the system's.
pub fn open_reader(
    setting: GpuTelemetrySource,
    nvidia_smi: &str,
    nvml_library: &str,
) -> Option<Box<dyn GpuReader>> {
    let smi = || -> Result<Box<dyn GpuReader>, String> {
        let mut r = SmiReader::new(nvidia_smi);
        let first = r.read()?;
        if first.is_empty() {
            return Err(format!("{nvidia_smi} lists no GPU"));
        }
        Ok(Box::new(r))
    };
    let nvml = || NvmlReader::open(nvml_library).map(|r| Box::new(r) as Box<dyn GpuReader>);
    let chosen = match setting {
        GpuTelemetrySource::Off => {
            tracing::info!("GPU telemetry is off (gpu_telemetry = \"off\")");
            return None;
        }
        GpuTelemetrySource::Nvml => nvml(),
        GpuTelemetrySource::NvidiaSmi => smi(),
        GpuTelemetrySource::Auto => nvml().or_else(|a| smi().map_err(|b| format!("{a}; {b}"))),
    };
    match chosen {
        Ok(r) => {
            tracing::info!(source = %r.source(), "GPU telemetry: reading the GPUs");
            Some(r)
        }
        Err(why) => {
            tracing::warn!(%why, "no GPU telemetry on this node: its GPUs' utilization is not reported");
            None
        }
    }
}

/// `flexq agent --gpu-check N`: each reader in turn reads the node's GPUs
/// `n` times, a second apart; prints every reading and the point a part
/// holding all of them would send. True when one of them could read.
/// `nvml_library`: as [`open_reader`]'s.
pub fn check(n: u32, nvidia_smi: &str, nvml_library: &str) -> bool {
    type Opened = Result<Box<dyn GpuReader>, String>;
    let readers: Vec<(&str, Opened)> = vec![
        (
            "NVML",
            NvmlReader::open(nvml_library).map(|r| Box::new(r) as Box<dyn GpuReader>),
        ),
        (
            "nvidia-smi",
            Ok(Box::new(SmiReader::new(nvidia_smi)) as Box<dyn GpuReader>),
        ),
    ];
    let mut any = false;
    for (name, reader) in readers {
        let mut reader = match reader {
            Ok(r) => r,
            Err(why) => {
                println!("{name}: cannot open: {why}");
                continue;
            }
        };
        let mut read_ok = 0;
        for k in 0..n.max(1) {
            if k > 0 {
                std::thread::sleep(Duration::from_secs(1));
            }
            let started = std::time::Instant::now();
            match reader.read() {
                Ok(readings) => {
                    read_ok += 1;
                    let all: Vec<String> = readings.iter().map(|r| r.index.clone()).collect();
                    for r in &readings {
                        println!(
                            "{name} #{k}: GPU {}: utilization {} memory used {} ({:?})",
                            r.index,
                            r.utilization_percent
                                .map_or("N/A".into(), |u| format!("{u} %")),
                            r.memory_used_mb
                                .map_or("N/A".into(), |m| format!("{m} MiB")),
                            started.elapsed()
                        );
                    }
                    match point(Utc::now(), 1.0, &all, &readings) {
                        Some(p) => println!(
                            "{name} #{k}: point for all {} GPUs: {}",
                            p.gpus,
                            serde_json::to_string(&p).unwrap_or_default()
                        ),
                        None => println!("{name} #{k}: no GPU reported a utilization"),
                    }
                }
                Err(why) => println!("{name} #{k}: cannot read: {why}"),
            }
        }
        println!("{name}: {read_ok} of {} readings", n.max(1));
        any |= read_ok > 0;
    }
    any
}

/// The GPUs each batch's parts hold on this node (batch uuid → addresses),
/// as the agent's assignments say.
pub type Held = BTreeMap<String, Vec<String>>;

/// A reader shared across the agent's sessions.
pub type SharedReader = Arc<std::sync::Mutex<Box<dyn GpuReader>>>;

/// Reads the GPUs every `interval` and uploads each batch's points every
/// `upload_every` readings, until the session ends or its lease is lost.
pub(super) async fn sample(
    ctx: Arc<Ctx>,
    reader: SharedReader,
    held: watch::Receiver<Held>,
    interval: Duration,
    upload_every: u32,
    session: CancellationToken,
) {
    let mut pending: HashMap<String, Vec<GpuPoint>> = HashMap::new();
    let mut failing = false;
    let mut n = 0u32;
    loop {
        tokio::select! {
            _ = session.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let r = reader.clone();
        let read = tokio::task::spawn_blocking(move || match r.lock() {
            Ok(mut reader) => reader.read(),
            Err(_) => Err("the reader panicked before".to_string()),
        });
        let readings = match tokio::time::timeout(Duration::from_secs(15), read).await {
            Ok(Ok(Ok(readings))) => {
                if failing {
                    tracing::info!("GPU telemetry: reading the GPUs again");
                    failing = false;
                }
                readings
            }
            Ok(Ok(Err(why))) => {
                if !failing {
                    tracing::warn!(%why, "GPU telemetry: the GPUs could not be read; trying again");
                    failing = true;
                }
                continue;
            }
            _ => continue,
        };
        let now = Utc::now();
        for (uuid, gpus) in held.borrow().iter() {
            if let Some(p) = point(now, interval.as_secs_f64(), gpus, &readings) {
                let kept = pending.entry(uuid.clone()).or_default();
                kept.push(p);
                if kept.len() > MAX_POINTS {
                    kept.remove(0);
                }
            }
        }
        n += 1;
        if n % upload_every.max(1) != 0 || pending.is_empty() {
            continue;
        }
        let batches: Vec<BatchGpuPoints> = pending
            .iter()
            .map(|(uuid, points)| BatchGpuPoints {
                uuid: uuid.clone(),
                points: points.clone(),
            })
            .collect();
        match ctx.client.telemetry(&ctx.epoch, batches).await {
            Ok(()) => pending.clear(),
            Err(CallError::LeaseLost(_)) => return,
            Err(CallError::Refused(e)) => {
                tracing::warn!(error = %e, "GPU telemetry refused; dropped");
                pending.clear();
            }
            Err(e) => {
                tracing::debug!(error = %e, "GPU telemetry not sent; kept for the next upload")
            }
        }
        // Points of batches this node no longer runs go once, then no more.
        let running = held.borrow();
        pending.retain(|uuid, _| running.contains_key(uuid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written in the layout `nvidia-smi --query-gpu=index,utilization.gpu,
    /// memory.used --format=csv,noheader,nounits` prints (one GPU a line),
    /// not recorded on a GPU here: these machines have none
    /// (`scripts/gpu-check` records the real one where a GPU is).
    const NOUNITS: &str = "0, 87, 21034\n1, 0, 3\n2, [N/A], [N/A]\n";
    /// The same with `--format=csv` (header and units), as people paste it.
    const WITH_UNITS: &str =
        "index, utilization.gpu [%], memory.used [MiB]\n0, 87 %, 21034 MiB\n1, 0 %, 3 MiB\n";

    /// Recorded by someone else, on real GPUs: the output of this very
    /// query with `--format=csv`, on a shared node of 4 GPUs, as pasted in
    /// a benchmark report in a public repository (found through a code
    /// search that did not name the repository), byte for byte.
    const RECORDED: &str = "index, utilization.gpu [%], memory.used [MiB]
0, 1 %, 529 MiB
1, 0 %, 5 MiB
2, 100 %, 74709 MiB
3, 0 %, 567 MiB
";

    #[test]
    fn a_recording_from_real_gpus_is_read() {
        let r = parse_smi_query(RECORDED).expect("parsed");
        let seen: Vec<_> = r
            .iter()
            .map(|g| (g.index.as_str(), g.utilization_percent, g.memory_used_mb))
            .collect();
        assert_eq!(
            seen,
            [
                ("0", Some(1.0), Some(529)),
                ("1", Some(0.0), Some(5)),
                ("2", Some(100.0), Some(74709)),
                ("3", Some(0.0), Some(567)),
            ]
        );
        // What a part holding GPUs 2 and 3 did in it.
        let p = crate::gpu::point(chrono::Utc::now(), 5.0, &["2".into(), "3".into()], &r)
            .expect("a point");
        assert_eq!(
            (
                p.gpus,
                p.utilization_percent,
                p.max_utilization_percent,
                p.max_memory_used_mb
            ),
            (2, 50.0, 100.0, 74709)
        );
    }

    #[test]
    fn the_query_is_read_with_or_without_units() {
        let r = parse_smi_query(NOUNITS).expect("parsed");
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].utilization_percent, Some(87.0));
        assert_eq!(r[0].memory_used_mb, Some(21034));
        assert_eq!(r[2].utilization_percent, None, "[N/A] is no value");
        let u = parse_smi_query(WITH_UNITS).expect("parsed");
        assert_eq!(u, r[..2].to_vec());
        assert!(parse_smi_query("").expect("empty").is_empty());
        let e = parse_smi_query("0, 87\n").expect_err("two fields");
        assert!(e.contains("expected"), "{e}");
        let e = parse_smi_query("GPU-1234, 87, 1\n").expect_err("not an index");
        assert!(e.contains("not a GPU index"), "{e}");
        let e = parse_smi_query("0, busy, 1\n").expect_err("not a number");
        assert!(e.contains("busy"), "{e}");
        for odd in ["0, NaN, 1\n", "0, inf, 1\n", "0, 5, -infinity\n"] {
            let e = parse_smi_query(odd).expect_err("not a finite number");
            assert!(e.contains("not a number"), "{odd:?}: {e}");
        }
    }

    /// A FAKE `nvidia-smi` (a shell script: these machines have no GPU)
    /// read through the real reader, and one that fails or hangs.
    #[test]
    fn the_smi_reader_runs_the_program_and_survives_its_failures() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = dir.path().join("nvidia-smi");
        let write = |body: &str| {
            std::fs::write(&fake, format!("#!/bin/sh\n{body}\n")).expect("write");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        };
        write(
            "[ \"$1\" = \"--query-gpu=index,utilization.gpu,memory.used\" ] || exit 9\nprintf '0, 55, 100\\n1, 5, 200\\n'",
        );
        let mut r = SmiReader::new(fake.to_str().expect("path"));
        let got = r.read().expect("read");
        assert_eq!(got[1].utilization_percent, Some(5.0));
        write("echo 'NVIDIA-SMI has failed' >&2; exit 6");
        let e = r.read().expect_err("fails");
        assert!(e.contains("NVIDIA-SMI has failed"), "{e}");
        let missing = SmiReader::new("/nonexistent/nvidia-smi").read();
        assert!(missing.is_err());
        // No reader at all: none, and no panic.
        assert!(
            open_reader(GpuTelemetrySource::NvidiaSmi, "/nonexistent/nvidia-smi", "").is_none()
        );
        assert!(open_reader(GpuTelemetrySource::Off, "nvidia-smi", "").is_none());
    }

    /// NVML from a library that is not there: it cannot open, says where
    /// it looked, and `auto` then has no reader either (its `nvidia-smi`
    /// is missing too). Pinned to a missing library, this holds on a
    /// machine with an NVIDIA driver as well as on one without.
    #[test]
    fn nvml_from_a_missing_library_cannot_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("no-such-libnvidia-ml.so.1");
        let missing = missing.to_str().expect("path");
        let e = NvmlReader::open(missing).err().expect("cannot open");
        assert!(e.starts_with("NVML ("), "{e}");
        assert!(e.contains("no-such-libnvidia-ml"), "{e}");
        assert!(
            open_reader(GpuTelemetrySource::Nvml, "/nonexistent/nvidia-smi", missing).is_none()
        );
        assert!(
            open_reader(GpuTelemetrySource::Auto, "/nonexistent/nvidia-smi", missing).is_none()
        );
    }

    /// A FAKE `nvidia-smi` that never answers (it writes its pid, then
    /// sleeps): the reader gives up after its timeout, says so, and kills
    /// and reaps it, so no process is left behind.
    #[test]
    fn a_hanging_smi_is_killed_after_the_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fake = dir.path().join("nvidia-smi");
        let pid_file = dir.path().join("pid");
        // `exec sleep`: the pid written is the one the reader spawned
        // (the shell becomes sleep), so the kill reaches it.
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh
# FAKE nvidia-smi that hangs
echo $$ > '{}'
exec sleep 1000
",
                pid_file.display()
            ),
        )
        .expect("write");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let mut r =
            SmiReader::new(fake.to_str().expect("path")).with_timeout(Duration::from_millis(500));
        let started = std::time::Instant::now();
        let e = r.read().expect_err("it hangs");
        let took = started.elapsed();
        assert!(e.contains("did not answer within 500ms"), "{e}");
        assert!(took >= Duration::from_millis(500), "gave up after {took:?}");
        assert!(took < Duration::from_secs(5), "gave up after {took:?}");
        let pid = std::fs::read_to_string(&pid_file).expect("the fake wrote its pid");
        let pid = pid.trim();
        assert!(!pid.is_empty());
        // Killed and reaped: no such process any more (not even a zombie;
        // a pid reused since would not be our sleep, hence the command check).
        let proc = std::path::Path::new("/proc").join(pid);
        match std::fs::read_to_string(proc.join("cmdline")) {
            Err(_) => {}
            Ok(cmdline) => assert!(
                !cmdline.contains("sleep"),
                "the hanging nvidia-smi ({pid}) still runs: {cmdline:?}"
            ),
        }
        assert_eq!(SMI_TIMEOUT, Duration::from_secs(10), "the agent's bound");
    }
}
