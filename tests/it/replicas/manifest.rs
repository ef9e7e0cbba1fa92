//! The Kubernetes manifest of the replicas (deploy/kubernetes/flexq.yaml):
//! three replicas, health probes on the metrics listener, the database URL from a Secret,
//! and a config that flexq accepts.

use std::path::Path;
use std::process::Command;

use crate::support::flexq_bin;

/// The Kubernetes manifest runs three replicas whose configuration flexq
/// accepts, probes them on the metrics listener, reads the database URL from a
/// Secret and names each replica after its pod; the bad lease setting of
/// a config is refused by name.
#[test]
fn the_kubernetes_manifest_runs_three_replicas_with_a_valid_config() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/flexq.yaml");
    let text = std::fs::read_to_string(&path).expect("manifest");
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("yaml document"))
        .collect();
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let deployment = kind("Deployment");
    assert_eq!(deployment["spec"]["replicas"], 3);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    // HTTP probes on the metrics listener (a flood of the API port does
    // not reach it: tests/it/connections.rs), the port the config binds.
    let ports = container["ports"].as_sequence().expect("ports");
    let named = |name: &str| {
        ports
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no port {name}"))["containerPort"]
            .as_u64()
            .expect("a port number")
    };
    assert_eq!(named("http"), 8080);
    let flexq_toml: toml::Value = kind("ConfigMap")["data"]["flexq.toml"]
        .as_str()
        .expect("flexq.toml")
        .parse()
        .expect("toml");
    let metrics_bind = flexq_toml["server"]["metrics_bind"]
        .as_str()
        .expect("server.metrics_bind");
    assert!(
        metrics_bind.ends_with(&format!(":{}", named("metrics"))),
        "{metrics_bind}"
    );
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(container[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(container[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    let env: Vec<&str> = container["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(env.contains(&"FLEXQ_DATABASE__URL") && env.contains(&"FLEXQ_DATABASE__REPLICA_ID"));
    assert_eq!(kind("PodDisruptionBudget")["spec"]["minAvailable"], 2);

    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("flexq.toml");
    std::fs::write(
        &config,
        kind("ConfigMap")["data"]["flexq.toml"]
            .as_str()
            .expect("flexq.toml"),
    )
    .expect("write");
    let check = |lease: Option<&str>| {
        let mut cmd = Command::new(flexq_bin());
        cmd.args(["config", "check", "--config"]).arg(&config).env(
            "FLEXQ_DATABASE__URL",
            "postgres://flexq@db.example:5432/flexq",
        );
        if let Some(lease) = lease {
            cmd.env("FLEXQ_DATABASE__LEADER_LEASE", lease);
        }
        cmd.output().expect("flexq config check")
    };
    let ok = check(None);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let bad = check(Some("500ms"));
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("database.leader_renew"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
