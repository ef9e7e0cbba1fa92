//! Finding the node's GPUs: a configured discovery script (Spark's own
//! format) or `nvidia-smi -L`. A node whose GPUs cannot be seen is not
//! offered: discovery failing is an error, never an empty list.

use std::time::Duration;

use serde::Deserialize;
use tokio::process::Command;

#[derive(Debug, Deserialize)]
struct Resource {
    name: String,
    addresses: Vec<String>,
}

/// Parses `{"name":"gpu","addresses":["0","1"]}`.
pub fn parse_script_output(out: &str) -> Result<Vec<String>, String> {
    let r: Resource = serde_json::from_str(out.trim()).map_err(|e| {
        format!(
            "expected {{\"name\":\"gpu\",\"addresses\":[...]}}, got {:?}: {e}",
            out.trim()
        )
    })?;
    if r.name != "gpu" {
        return Err(format!("resource name is {:?}, expected \"gpu\"", r.name));
    }
    Ok(r.addresses)
}

/// Parses `nvidia-smi -L`: `GPU 0: NVIDIA L4 (UUID: GPU-…)` per GPU.
pub fn parse_nvidia_smi(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("GPU "))
        .filter_map(|l| l.split(':').next())
        .map(|i| i.trim().to_string())
        .filter(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
        .collect()
}

/// The GPU addresses of this node: the discovery `script`'s, or where it
/// is empty, `nvidia_smi -L`'s.
pub async fn discover(nvidia_smi: &str, script: &str) -> Result<Vec<String>, String> {
    let (program, args, what): (&str, &[&str], String) = if script.is_empty() {
        (nvidia_smi, &["-L"], format!("{nvidia_smi} -L"))
    } else {
        (script, &[], format!("discovery script {script}"))
    };
    let run = Command::new(program).args(args).kill_on_drop(true).output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .map_err(|_| format!("{what} did not answer within 30s"))?
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let gpus = if script.is_empty() {
        parse_nvidia_smi(&text)
    } else {
        parse_script_output(&text).map_err(|e| format!("{what}: {e}"))?
    };
    if gpus.is_empty() {
        return Err(format!("{what} found no GPUs"));
    }
    Ok(gpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_sources() {
        assert_eq!(
            parse_script_output(r#"{"name":"gpu","addresses":["0","1"]}"#),
            Ok(vec!["0".to_string(), "1".to_string()])
        );
        assert!(parse_script_output(r#"{"name":"fpga","addresses":["0"]}"#).is_err());
        assert!(parse_script_output("0,1").is_err());
        let smi = "GPU 0: NVIDIA L4 (UUID: GPU-1a2b)\nGPU 1: NVIDIA L4 (UUID: GPU-3c4d)\n";
        assert_eq!(parse_nvidia_smi(smi), vec!["0", "1"]);
        assert!(parse_nvidia_smi("No devices were found\n").is_empty());
    }
}
