//! The optional HTTPS listener: served with a configured certificate,
//! verified by the CLI and the agent against a private CA, refused
//! without it.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{TestServer, fake_gpu_script, flexq_bin, self_signed, spawn_agent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_is_served_and_verified_by_the_cli_and_the_agent() {
    let tls = self_signed();
    let s = TestServer::start_https(&tls, |_| {}).await;
    let base = format!("https://127.0.0.1:{}", s.addr.port());
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&tls.cert).expect("pem")).expect("ca");
    let trusted = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .expect("client");
    let r = trusted
        .get(format!("{base}/v1/runtimes"))
        .send()
        .await
        .expect("https");
    assert_eq!(r.status(), 200);

    // Not trusted without the CA; no plain HTTP on the TLS port.
    let err = reqwest::get(format!("{base}/v1/runtimes"))
        .await
        .expect_err("unverified");
    assert!(
        format!("{err:?}").to_lowercase().contains("certificate"),
        "{err:?}"
    );
    let plain = reqwest::get(format!("http://127.0.0.1:{}/v1/runtimes", s.addr.port())).await;
    assert!(
        plain.map(|r| r.status() != 200).unwrap_or(true),
        "plain HTTP is not served on the HTTPS listener"
    );

    // The CLI verifies it with --ca-cert, and refuses it without.
    let cli = |ca: Option<&std::path::Path>| {
        let mut cmd = Command::new(flexq_bin());
        cmd.args(["regions", "list", "--endpoint", &base])
            .env_remove("FLEXQ_CA_CERT");
        if let Some(ca) = ca {
            cmd.arg("--ca-cert").arg(ca);
        }
        cmd.output().expect("run flexq")
    };
    let ok = tokio::task::block_in_place(|| cli(Some(&tls.cert)));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains("REGION"),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    let refused = tokio::task::block_in_place(|| cli(None));
    assert!(!refused.status.success());

    // The agent registers over HTTPS with its ca_file.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "server = \"{base}\"\nca_file = \"{}\"\nnode_id = \"tls-node\"\nregion = \"us-central1\"\nzone = \"us-central1-b\"\npool = \"l4\"\ncores = 8\nmemory_mb = 65536\nlocal_ssd_gb = 375\ngpu_discovery_script = \"{}\"\nwork_dir = \"{}\"\nlauncher = \"kubernetes\"\n",
            tls.cert.display(),
            fake_gpu_script(dir.path()).display(),
            dir.path().join("work").display()
        ),
    )
    .expect("config");
    let mut agent = spawn_agent(&config, &dir.path().join("agent.log"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let nodes: serde_json::Value = trusted
            .get(format!("{base}/v1/nodes"))
            .send()
            .await
            .expect("nodes")
            .json()
            .await
            .expect("json");
        if nodes["nodes"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n["id"] == "tls-node"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not register over HTTPS"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = agent.kill();
    let _ = agent.wait();
}
