//! Loading and checking the config, what a reload changes, and redaction.

use super::*;
use figment::Jail;

#[test]
fn embedded_default_is_valid() {
    let config = Config::load_without_env(None).expect("default config loads");
    assert_eq!(
        config.provisioning.default_allocation_timeout,
        Duration::from_secs(3600)
    );
    assert!(config.database_url().ends_with("data/flexq.db?mode=rwc"));
}

#[test]
fn environment_overrides_a_key_with_humantime() {
    Jail::expect_with(|jail| {
        jail.set_env("FLEXQ_PROVISIONING__DEFAULT_ALLOCATION_TIMEOUT", "45m");
        jail.set_env("FLEXQ_PROJECT", "not-a-config-key");
        let config = Config::load(None).map_err(|e| e.to_string())?;
        assert_eq!(
            config.provisioning.default_allocation_timeout,
            Duration::from_secs(45 * 60)
        );
        Ok(())
    });
}

#[test]
fn default_timeout_above_the_ceiling_names_the_key() {
    Jail::expect_with(|jail| {
        jail.set_env("FLEXQ_PROVISIONING__DEFAULT_ALLOCATION_TIMEOUT", "3h");
        let err = Config::load(None).expect_err("3h is above 2h").to_string();
        assert!(
            err.contains("provisioning.default_allocation_timeout"),
            "{err}"
        );
        Ok(())
    });
}

#[test]
fn maximum_above_two_hours_is_refused() {
    Jail::expect_with(|jail| {
        jail.set_env("FLEXQ_PROVISIONING__MAX_ALLOCATION_TIMEOUT", "7201s");
        let err = Config::load(None).expect_err("above 7200s").to_string();
        assert!(err.contains("provisioning.max_allocation_timeout"), "{err}");
        Ok(())
    });
}

#[test]
fn a_malformed_value_names_the_key() {
    Jail::expect_with(|jail| {
        jail.set_env("FLEXQ_SERVER__BIND", "not-an-address");
        let err = Config::load(None).expect_err("bad bind").to_string();
        assert!(err.to_lowercase().contains("server.bind"), "{err}");
        Ok(())
    });
}

#[test]
fn an_unknown_key_in_a_file_is_refused() {
    Jail::expect_with(|jail| {
        jail.create_file("bad.toml", "[server]\nbindd = \"127.0.0.1:1\"\n")?;
        let err = Config::load_without_env(Some(Path::new("bad.toml")))
            .expect_err("unknown key")
            .to_string();
        assert!(err.contains("bindd"), "{err}");
        Ok(())
    });
}

#[test]
fn an_unknown_gpu_type_in_a_region_is_refused() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "bad.toml",
            "[regions.us-east1.zones.us-east1-b.node_pools.p]\naccelerator = \"h100\"\ngpus_per_node = 8\ncores = 96\nmemory_mb = 1\nlocal_ssd_gb = 1\nmax_nodes = 1\n",
        )?;
        let err = Config::load_without_env(Some(Path::new("bad.toml")))
            .expect_err("unknown gpu")
            .to_string();
        assert!(
            err.contains("regions.us-east1.zones.us-east1-b.node_pools.p.accelerator"),
            "{err}"
        );
        Ok(())
    });
}

#[test]
fn fair_share_keys_that_make_no_sense_are_named() {
    for (toml, key, says) in [
        (
            "[projects.team-a]\nweight = 0\n",
            "projects.team-a.weight",
            "0.000001 to 1000000",
        ),
        (
            "[projects.team-a]\nweight = -2\n",
            "projects.team-a.weight",
            "-2 is not a weight",
        ),
        (
            "[projects.team-a]\nweight = inf\n",
            "projects.team-a.weight",
            "inf is not a weight",
        ),
        (
            "[projects.team-a]\nweight = \"heavy\"\n",
            "projects.team-a.weight",
            "heavy",
        ),
        (
            "[scheduling]\nusage_half_life = \"0s\"\n",
            "scheduling.usage_half_life",
            "1s to 365d",
        ),
        (
            "[scheduling]\nusage_half_life = \"400days\"\n",
            "scheduling.usage_half_life",
            "1s to 365d",
        ),
        (
            "[scheduling]\nusage_half_life = \"soon\"\n",
            "usage_half_life",
            "soon",
        ),
        (
            "[scheduling]\norder = \"fifo\"\n",
            "scheduling.order",
            "fair-share",
        ),
        (
            "[scheduling]\ngpu_weights = { h100 = 2 }\n",
            "scheduling.gpu_weights.h100",
            "accepted: l4, a100-40, a100-80",
        ),
        (
            "[scheduling]\ngpu_weights = { a100-40 = 0 }\n",
            "scheduling.gpu_weights.a100-40",
            "0.000001 to 1000000",
        ),
        (
            "[[alternatives]]\nrungs = [\"h100 after 5m\"]\n",
            "alternatives[0].rungs",
            "GPU type \"h100\" is not supported; accepted: l4, a100-40, a100-80",
        ),
        (
            "[[alternatives]]\nrungs = [\"region mars-1 after 5m\"]\n",
            "alternatives[0].rungs",
            "region \"mars-1\" is not served",
        ),
        (
            "[[alternatives]]\nrungs = [\"a100-40 after 3h\"]\n",
            "alternatives[0].rungs",
            "not within provisioning.max_allocation_timeout",
        ),
        (
            "[[alternatives]]\nrungs = [\"a100-40 after 5m\", \"a100-40 after 9m\"]\n",
            "alternatives[0].rungs",
            "named twice",
        ),
        (
            "[[alternatives]]\nallow = [\"quantum\"]\n",
            "alternatives[0].allow",
            "GPU type \"quantum\" is not supported",
        ),
        (
            "[[alternatives]]\naccelerator = \"h100\"\n",
            "alternatives[0].accelerator",
            "\"h100\" is not a GPU type",
        ),
    ] {
        let err = Config::with_overlay(toml).expect_err(toml).to_string();
        assert!(err.contains(key) && err.contains(says), "{toml}: {err}");
    }
    let c = Config::with_overlay(
        "[scheduling]\norder = \"strict\"\nusage_half_life = \"7d\"\ngpu_weights = { a100-80 = 4 }\n[projects.a]\nweight = 2.5\n",
    )
    .expect("valid");
    let policy = c.fair_share();
    assert_eq!(policy.order, crate::scheduler::Order::Strict);
    assert_eq!(policy.half_life, Duration::from_secs(7 * 86400));
    assert_eq!(policy.weight("a"), 2.5);
    assert_eq!(policy.weight("b"), 1.0);
    assert_eq!(
        policy.gpu_weight(Some(crate::spec::Accelerator::A100_80)),
        4.0
    );
    assert_eq!(policy.gpu_weight(Some(crate::spec::Accelerator::L4)), 1.0);
    assert_eq!(policy.gpu_weight(None), 1.0);
}

#[test]
fn a_reload_keeps_restart_only_sections_and_names_every_changed_key() {
    let in_force = Config::with_overlay(
        "[server]\nrequest_timeout = \"30s\"\n[database]\nurl = \"postgres://u:secret@db/x\"\n",
    )
    .expect("valid");
    let file = Config::with_overlay(
        "[server]\nrequest_timeout = \"40s\"\n[provisioning]\ndefault_allocation_timeout = \"30m\"\n[projects.team-a]\nweight = 2\n[[quotas]]\nproject = \"*\"\nregion = \"*\"\nmetric = \"PREEMPTIBLE_NVIDIA_L4_GPUS\"\nlimit = 3\n",
    )
    .expect("valid");
    let next = in_force.with_live(&file.live_value()).expect("applies");
    assert_eq!(next.server.request_timeout, Duration::from_secs(30));
    assert_eq!(next.database.url, in_force.database.url);
    assert_eq!(
        next.provisioning.default_allocation_timeout,
        Duration::from_secs(1800)
    );
    assert_eq!(
        next.digest(),
        file.digest(),
        "the digest is of live keys only"
    );
    assert_ne!(next.digest(), in_force.digest());
    let (live, _) = in_force.changes(&next);
    let keys: Vec<&str> = live.iter().map(|c| c.key.as_str()).collect();
    assert!(
        keys.contains(&"provisioning.default_allocation_timeout"),
        "{keys:?}"
    );
    assert!(keys.contains(&"projects.team-a.weight"), "{keys:?}");
    assert!(keys.iter().any(|k| k.starts_with("quotas[")), "{keys:?}");
    let timeout = live
        .iter()
        .find(|c| c.key == "provisioning.default_allocation_timeout")
        .expect("changed");
    assert_eq!(
        (timeout.from.as_deref(), timeout.to.as_deref()),
        (Some("\"1h\""), Some("\"30m\""))
    );
    let (_, restart) = in_force.changes(&file);
    let keys: Vec<&str> = restart.iter().map(|c| c.key.as_str()).collect();
    assert_eq!(keys, vec!["database.url", "server.request_timeout"]);
    assert!(
        restart.iter().all(|c| !format!("{c:?}").contains("secret")),
        "{restart:?}"
    );
    // A stored generation that breaks a rule is refused naming the key.
    let mut live = file.live_value();
    live["provisioning"]["default_allocation_timeout"] = "5h".into();
    let e = in_force.with_live(&live).expect_err("above the ceiling");
    assert!(
        e.to_string()
            .contains("provisioning.default_allocation_timeout"),
        "{e}"
    );
}

#[test]
fn passwords_are_redacted() {
    assert_eq!(
        redact_url("postgres://flexq:s3cret@db:5432/flexq"),
        "postgres://flexq:REDACTED@db:5432/flexq"
    );
    assert_eq!(redact_url("sqlite://data/x.db"), "sqlite://data/x.db");
}

#[test]
fn principals_are_checked_and_no_tokens_means_loopback_only() {
    let mut c = Config::load_without_env(None).expect("default");
    c.server.bind = "0.0.0.0:8080".parse().expect("addr");
    let e = c.check().expect_err("open bind without tokens");
    assert!(e.to_string().contains("server.bind"), "{e}");
    c.principals.push(PrincipalConfig {
        name: "a".into(),
        role: PrincipalRole::Submitter,
        projects: vec![],
        node: None,
        token_sha256: "0".repeat(64),
    });
    let e = c.check().expect_err("submitter without projects");
    assert!(e.to_string().contains("principals[0].projects"), "{e}");
    c.principals[0].projects.push("demo".into());
    c.principals[0].token_sha256 = "not-a-hash".into();
    let e = c.check().expect_err("bad hash");
    assert!(e.to_string().contains("principals[0].token_sha256"), "{e}");
    c.principals[0].token_sha256 = "a".repeat(64);
    c.check().expect("valid with a principal on 0.0.0.0");
    for wild in ["-", "*"] {
        c.principals[0].projects = vec!["demo".into(), wild.into()];
        let e = c.check().expect_err("every project is not a submitter's");
        let text = e.to_string();
        assert!(
            text.contains("principals[0].projects") && text.contains(&format!("\"{wild}\"")),
            "{text}"
        );
    }
}

#[test]
fn a_preemption_policy_is_checked_and_converted() {
    for (toml, key, says) in [
        (
            "[regions.us-central1.preemption]\nenabled = true\nby_priority = false\n",
            "regions.us-central1.preemption.enabled",
            "neither by_priority nor by_fair_share",
        ),
        (
            "[regions.us-central1.preemption]\nfair_share_margin = 0.5\n",
            "regions.us-central1.preemption.fair_share_margin",
            "from 1 to 100",
        ),
        (
            "[regions.us-central1.preemption]\nmax_preemptions = 0\n",
            "regions.us-central1.preemption.max_preemptions",
            "from 1 to 100",
        ),
        (
            "[regions.us-central1.preemption]\ngrace = \"30d\"\n",
            "regions.us-central1.preemption.grace",
            "from 0s to 7d",
        ),
        (
            "[regions.us-central1.preemption]\nenable = true\n",
            "enable",
            "unknown field",
        ),
    ] {
        let err = Config::with_overlay(toml).expect_err(toml).to_string();
        assert!(err.contains(key) && err.contains(says), "{toml}: {err}");
    }
    // Valid, and what the core and the rules see of it.
    let on = Config::with_overlay(
        "[regions.us-central1.preemption]\nenabled = true\nallow_opt_out = false\nmin_runtime = \"5m\"\n",
    )
    .expect("valid");
    let policies = on.preemption();
    let p = policies.get("us-central1").expect("on in us-central1");
    assert_eq!(p.min_runtime, Duration::from_secs(300));
    assert!(p.by_priority && !p.by_fair_share && !p.allow_opt_out);
    assert_eq!(policies.len(), 1);
    assert_eq!(
        on.policy().preemption_opt_out.get("us-central1"),
        Some(&false)
    );
    // Present but off: nothing preempts.
    let off = Config::with_overlay("[regions.us-central1.preemption]\nmin_runtime = \"5m\"\n")
        .expect("valid");
    assert!(off.preemption().is_empty());
}

#[test]
fn a_gpu_idle_policy_is_checked() {
    let c = Config::with_overlay("").expect("default");
    assert_eq!(c.gpu_idle, crate::gpu::IdlePolicy::default());
    assert_eq!(c.gpu_idle.action, crate::gpu::IdleAction::Warn);
    for (toml, key, says) in [
        (
            "[gpu_idle]\nbelow_percent = 0\n",
            "gpu_idle.below_percent",
            "above 0 and at most 100",
        ),
        (
            "[gpu_idle]\nbelow_percent = 101\n",
            "gpu_idle.below_percent",
            "at most 100",
        ),
        (
            "[gpu_idle]\nafter = \"0s\"\n",
            "gpu_idle.after",
            "from 1s to 7d",
        ),
        (
            "[gpu_idle]\nwarm_up = \"30d\"\n",
            "gpu_idle.warm_up",
            "from 0s to 7d",
        ),
        ("[gpu_idle]\naction = \"kill\"\n", "kill", "unknown variant"),
        ("[gpu_idle]\nthreshold = 5\n", "threshold", "unknown field"),
    ] {
        let err = Config::with_overlay(toml).expect_err(toml).to_string();
        assert!(err.contains(key) && err.contains(says), "{toml}: {err}");
    }
    let c =
        Config::with_overlay("[gpu_idle]\naction = \"cancel\"\nafter = \"1h\"\n").expect("valid");
    assert_eq!(c.gpu_idle.action, crate::gpu::IdleAction::Cancel);
    assert_eq!(c.gpu_idle.after, Duration::from_secs(3600));
}

#[test]
fn every_invalid_key_is_reported_at_once() {
    let toml = "[server]\nmax_connections = 0\nmax_body_bytes = 10\n\
                [scheduling]\nusage_half_life = \"0s\"\n\
                [database]\nleader_renew = \"100000000000y\"\n\
                [[alternatives]]\nrungs = [\"a100-40 after 3h\"]\n";
    let err = Config::with_overlay(toml).expect_err("five bad keys");
    let keys = err.keys();
    for key in [
        "server.max_connections",
        "server.max_body_bytes",
        "scheduling.usage_half_life",
        "database.leader_renew",
        "alternatives[0].rungs",
    ] {
        assert!(keys.contains(&key), "{key} not reported: {err}");
    }
    let text = err.to_string();
    assert!(text.starts_with("5 errors: config key `"), "{text}");
    // One bad key is still the one error it was.
    let one = Config::with_overlay("[server]\nmax_connections = 0\n").expect_err("one bad key");
    assert!(matches!(one, ConfigError::Invalid { .. }), "{one}");
}

/// A pool's provisioner with `keys` (TOML lines), its programs valid
/// unless `keys` names them.
fn provisioner_overlay(keys: &str) -> String {
    let mut programs = String::new();
    if !keys.contains("resume_program") {
        programs.push_str("resume_program = [\"sh\", \"-c\", \"true\"]\n");
    }
    if !keys.contains("suspend_program") {
        programs.push_str("suspend_program = [\"sh\"]\n");
    }
    format!(
        "[regions.us-central1.zones.us-central1-a.node_pools.l4]\nvirtual_nodes = 0\n\
         [regions.us-central1.zones.us-central1-a.node_pools.l4.provisioner]\n{programs}{keys}"
    )
}

#[test]
fn a_provisioner_is_checked_key_by_key() {
    let pool = "regions.us-central1.zones.us-central1-a.node_pools.l4.provisioner";
    let ok = Config::with_overlay(&provisioner_overlay("min_nodes = 2\n")).expect("valid");
    let p = ok.regions["us-central1"].zones["us-central1-a"].node_pools["l4"]
        .provisioner
        .clone()
        .expect("a provisioner");
    assert_eq!(
        (
            p.resume_timeout,
            p.suspend_after,
            p.min_nodes,
            p.resume_rate
        ),
        (Duration::from_secs(600), Duration::from_secs(600), 2, 300)
    );
    for (keys, key, says) in [
        (
            "resume_program = [\"/nonexistent/resume\"]\n".to_string(),
            format!("{pool}.resume_program"),
            "/nonexistent/resume: cannot be read",
        ),
        (
            "resume_program = []\n".to_string(),
            format!("{pool}.resume_program"),
            "is empty",
        ),
        (
            "suspend_program = [\"no-such-program-here\"]\n".to_string(),
            format!("{pool}.suspend_program"),
            "not found on PATH",
        ),
        (
            "min_nodes = 9\n".to_string(),
            format!("{pool}.min_nodes"),
            "9 is above max_nodes (8)",
        ),
        (
            "resume_timeout = \"0s\"\n".to_string(),
            format!("{pool}.resume_timeout"),
            "out of range",
        ),
        (
            "resume_timeout = \"-5s\"\n".to_string(),
            format!("{pool}.resume_timeout"),
            "-5s",
        ),
        (
            "[regions.us-central1.zones.us-central1-a.node_pools.l4.provisioner.backoff]\nbase = \"10m\"\nmax = \"1m\"\n".to_string(),
            format!("{pool}.backoff.max"),
            "out of range: from 10m",
        ),
    ] {
        let overlay = provisioner_overlay(&keys);
        let err = Config::with_overlay(&overlay).expect_err(&overlay).to_string();
        assert!(err.contains(&key) && err.contains(says), "{keys}: {err}");
    }
    // Virtual nodes are the operator's fleet, not a provisioner's.
    let mut with_virtual = ok.clone();
    if let Some(z) = with_virtual.regions.get_mut("us-central1") {
        if let Some(p) = z
            .zones
            .get_mut("us-central1-a")
            .and_then(|z| z.node_pools.get_mut("l4"))
        {
            p.virtual_nodes = 1;
        }
    }
    let err = with_virtual.check().expect_err("virtual nodes").to_string();
    assert!(
        err.contains(pool) && err.contains("virtual_nodes = 0"),
        "{err}"
    );
}
