//! The simulator, and through it the fair-share order over long virtual
//! times: shares follow weights, a light project is not stuck behind a
//! heavy backlog, a big gang is not starved, and a seed replays exactly.

use std::fmt::Write as _;

use super::*;

const HEADER: &str = "submit_s,project,region,run_s,allocation_timeout,executors,ttl\n";

/// europe-west4-a of the default config: 8 nodes of 4 L4 GPUs (32 GPUs),
/// here with quota enough for one project to hold them all (the default
/// lets a project hold 24). A `quotas` list replaces the default's whole.
fn config(extra: &str) -> Config {
    let mut quotas = String::new();
    for (metric, limit) in [
        ("PREEMPTIBLE_NVIDIA_L4_GPUS", 64),
        ("NVIDIA_L4_GPUS", 8),
        ("LOCAL_SSD_TOTAL_GB", 30000),
    ] {
        let _ = write!(
            quotas,
            "[[quotas]]\nproject = \"*\"\nregion = \"*\"\nmetric = \"{metric}\"\nlimit = {limit}\n"
        );
    }
    Config::with_overlay(&format!("{extra}\n{quotas}")).expect("config")
}

/// `projects` each submit a 3-GPU batch (driver and 2 executors) every
/// `every_s` from `from_s` to `until_s`, running `run_s`.
fn stream(
    out: &mut String,
    projects: &[&str],
    from_s: u64,
    until_s: u64,
    every_s: u64,
    run_s: u64,
) {
    let mut t = from_s;
    while t < until_s {
        for p in projects {
            let _ = writeln!(out, "{t},{p},europe-west4,{run_s},7200s,2,");
        }
        t += every_s;
    }
}

fn trace(csv: &str) -> Vec<TraceBatch> {
    read(csv.as_bytes()).expect("trace")
}

#[test]
fn saturating_projects_get_gpu_hours_in_proportion_to_their_weights() {
    let cfg =
        config("[projects.a]\nweight = 1\n[projects.b]\nweight = 2\n[projects.c]\nweight = 1\n");
    let mut csv = HEADER.to_string();
    // A week; each project asks far more than the zone holds.
    stream(&mut csv, &["a", "b", "c"], 0, 7 * 24 * 3600, 300, 1800);
    let r = run(&cfg, &trace(&csv), 0).expect("run");
    for (name, want) in [("a", 0.25), ("b", 0.5), ("c", 0.25)] {
        let p = &r.projects[name];
        assert!(
            (p.gpu_share / want - 1.0).abs() <= 0.10,
            "{name}: {:.3} of the GPU-hours, weight share {want}\n{}",
            p.gpu_share,
            r.table()
        );
        assert!(p.expired > 0, "saturated: some expire\n{}", r.table());
    }
    // The zone was kept busy: 30 of its 32 GPUs fit 3-GPU clusters.
    let util = r.zones["europe-west4-a"].utilisation;
    assert!(util > 0.85, "utilisation {util}\n{}", r.table());
}

#[test]
fn equal_weights_share_equally_and_strict_order_does_not() {
    // Project "early" submits its batches a little before "late" each
    // time: strict order (age) favours it every time; fair share does not.
    let mut csv = HEADER.to_string();
    stream(&mut csv, &["early"], 0, 3 * 24 * 3600, 300, 1800);
    stream(&mut csv, &["late"], 1, 3 * 24 * 3600, 300, 1800);
    let t = trace(&csv);
    let fair = run(&config(""), &t, 0).expect("fair");
    let strict = run(&config("[scheduling]\norder = \"strict\"\n"), &t, 0).expect("strict");
    let share = |r: &SimReport, p: &str| r.projects[p].gpu_share;
    assert!(
        (share(&fair, "late") - 0.5).abs() <= 0.05,
        "{}",
        fair.table()
    );
    assert!(
        share(&strict, "late") < 0.45 && strict.projects["late"].expired > 0,
        "strict order gives the early submitter the most\n{}",
        strict.table()
    );
}

#[test]
fn a_light_project_starts_before_a_heavy_backlog() {
    let mut csv = HEADER.to_string();
    // "heavy" queues 200 batches at once: the zone holds 10.
    for _ in 0..200 {
        csv.push_str("0,heavy,europe-west4,1800,7200s,2,\n");
    }
    // "light" asks for one batch a minute later.
    csv.push_str("60,light,europe-west4,1800,7200s,2,\n");
    let t = trace(&csv);
    let fair = run(&config(""), &t, 0).expect("fair");
    let light = &fair.projects["light"];
    assert_eq!(light.allocated, 1, "{}", fair.table());
    // It starts at the first release: when the first heavy clusters end.
    let waited = light.wait_p50_s.expect("a wait");
    assert!(
        waited <= 1800.0 - 60.0 + 1.0,
        "waited {waited}s\n{}",
        fair.table()
    );

    // Under strict order it waits behind the backlog: until the heavy
    // batches it cannot pass expire, two hours later.
    let strict = run(&config("[scheduling]\norder = \"strict\"\n"), &t, 0).expect("strict");
    let light = &strict.projects["light"];
    assert!(
        light.expired == 1 || light.wait_p50_s.is_some_and(|w| w > 3600.0),
        "{}",
        strict.table()
    );
}

#[test]
fn a_big_gang_is_not_starved_by_a_stream_of_small_batches() {
    let mut csv = HEADER.to_string();
    // Two projects keep the zone full with 3-GPU batches of 10 minutes…
    stream(&mut csv, &["x", "y"], 0, 6 * 3600, 120, 600);
    // …and "gang" asks for 24 GPUs (a driver and 23 executors) at once.
    csv.push_str("900,gang,europe-west4,600,7200s,23,\n");
    let r = run(&config(""), &trace(&csv), 0).expect("run");
    let gang = &r.projects["gang"];
    assert_eq!(gang.allocated, 1, "the gang expired\n{}", r.table());
    // Capacity is kept for it as the small ones end (their ttl of 4h
    // cannot end before its start): about one run of the small ones.
    let waited = gang.wait_p50_s.expect("a wait");
    assert!(waited <= 900.0, "waited {waited}s\n{}", r.table());
}

#[test]
fn the_same_trace_config_and_seed_give_the_same_report() {
    let mut csv = HEADER.to_string();
    // Ties: every project submits at the same instants.
    stream(&mut csv, &["a", "b", "c", "d"], 0, 24 * 3600, 600, 2400);
    let t = trace(&csv);
    let cfg = config("[projects.d]\nweight = 3\n");
    let one = serde_json::to_string(&run(&cfg, &t, 7).expect("run")).expect("json");
    let two = serde_json::to_string(&run(&cfg, &t, 7).expect("run")).expect("json");
    assert_eq!(one, two);
    let unseeded = serde_json::to_string(&run(&cfg, &t, 0).expect("run")).expect("json");
    let again = serde_json::to_string(&run(&cfg, &t, 0).expect("run")).expect("json");
    assert_eq!(unseeded, again);
}

#[test]
fn refusals_and_bad_batches_are_reported_by_line() {
    // 41 GPUs, above what any zone of the region declares (32): refused
    // as the API would.
    let csv = format!("{HEADER}0,a,europe-west4,60,,40,\n0,a,europe-west4,60,,2,\n");
    let r = run(&config(""), &trace(&csv), 0).expect("run");
    assert_eq!(r.projects["a"].refused, 1);
    assert_eq!(r.projects["a"].allocated, 1);
    // A batch the rules refuse stops the run, naming its line and field.
    let csv = format!("{HEADER}0,a,europe-west4,60,9000s,2,\n");
    let e = run(&config(""), &trace(&csv), 0).expect_err("timeout above 7200s");
    assert_eq!(e.line, 2);
    assert!(e.message.contains("allocationTimeout"), "{e}");
    // A region flexq does not serve.
    let csv = format!("{HEADER}0,a,mars-north1,60,,2,\n");
    let e = run(&config(""), &trace(&csv), 0).expect_err("region");
    assert!(e.message.contains("mars-north1"), "{e}");
}

#[test]
fn a_region_alternatives_gpu_hours_count_in_the_zone_it_ran_in() {
    // 12 batches of 3 GPUs for an hour at once in europe-west4 (32 L4
    // GPUs: 10 fit), each allowed us-central1 after a minute.
    let cfg = config(
        "[[alternatives]]\naccelerator = \"l4\"\nrungs = [\"region us-central1 after 1m\"]\n",
    );
    let mut csv = HEADER.to_string();
    for _ in 0..12 {
        csv.push_str("0,research,europe-west4,3600,7200s,2,\n");
    }
    let r = run(&cfg, &trace(&csv), 0).expect("runs");
    assert_eq!(r.alternatives.get(&1).copied(), Some(2), "{}", r.table());
    let spilled: f64 = r
        .zones
        .iter()
        .filter(|(z, _)| z.starts_with("us-central1"))
        .map(|(_, s)| {
            assert!(s.gpus > 0, "{}", r.table());
            s.utilisation
        })
        .sum();
    assert!(spilled > 0.0, "{}", r.table());
}

/// An elastic batch alone grows to what Spark wants while nothing waits,
/// gives its extras back when its peak is over, and the GPU-hours count
/// each extra from its grant to its release; the same batch sized for its
/// peak holds the GPUs Spark no longer wants, idle.
#[test]
fn an_elastic_batch_grows_for_its_peak_and_a_fixed_one_holds_it_idle() {
    let header = "submit_s,project,region,run_s,allocation_timeout,executors,max_executors,min_executors,peak_share\n";
    // 1 + 2 executors, up to 6, for the first half of an hour.
    let elastic = format!("{header}0,a,europe-west4,3600,3600s,2,6,2,0.5\n");
    let r = run(&config(""), &trace(&elastic), 0).expect("run");
    let e = r.elastic.as_ref().expect("elastic stats");
    assert_eq!((e.clusters, e.extras_granted), (1, 4), "{e:?}");
    // 4 extras for half an hour; the core, 3 GPUs for the hour.
    assert!((e.extra_gpu_hours - 2.0).abs() < 1e-6, "{e:?}");
    assert!(
        (r.projects["a"].gpu_hours - 5.0).abs() < 1e-6,
        "{:?}",
        r.projects["a"]
    );
    assert_eq!(e.idle_gpu_hours, 0.0);

    // Sized for the peak: 1 + 6 for the hour, of which 4 are idle for
    // its second half.
    let fixed = format!("{header}0,a,europe-west4,3600,3600s,6,,2,0.5\n");
    let r = run(&config(""), &trace(&fixed), 0).expect("run");
    let e = r.elastic.as_ref().expect("elastic stats");
    assert_eq!((e.clusters, e.extras_granted), (0, 0), "{e:?}");
    assert!((e.idle_gpu_hours - 2.0).abs() < 1e-6, "{e:?}");
    assert!((r.projects["a"].gpu_hours - 7.0).abs() < 1e-6);

    // With extras off in the region, the elastic batch runs on its core.
    let off = config("[regions.europe-west4.elastic]\nenabled = false\n");
    let r = run(&off, &trace(&elastic), 0).expect("run");
    assert_eq!(r.elastic.as_ref().map(|e| e.extras_granted), Some(0));
    assert!((r.projects["a"].gpu_hours - 3.0).abs() < 1e-6);
}

/// GPUs freed while a gang still waits for more stay free: no extra
/// takes them.
#[test]
fn extras_are_not_granted_while_a_gang_waits_for_the_gpus() {
    let header = "submit_s,project,region,run_s,allocation_timeout,executors,max_executors\n";
    // 32 L4 GPUs: g holds 25 for an hour, k 3 for 15 minutes; a (1 + 2,
    // up to 20) takes the one left as an extra; w (1 + 5) waits for g.
    let csv = format!(
        "{header}0,g,europe-west4,3600,7200s,24,\n0,k,europe-west4,900,7200s,2,\n\
         10,a,europe-west4,7200,7200s,2,20\n20,w,europe-west4,600,7200s,5,\n"
    );
    let r = run(&config(""), &trace(&csv), 0).expect("run");
    let e = r.elastic.as_ref().expect("elastic stats");
    assert_eq!(
        r.projects["w"].wait_p50_s,
        Some(3580.0),
        "{:?}",
        r.projects["w"]
    );
    // k's 3 GPUs, freed at 15 minutes, wait for w with it; at g's end w
    // goes first, and a grows to its most (18 extras: 1 from the start,
    // 17 from g's end).
    assert_eq!(e.extras_granted, 18, "{e:?}");
    let want = (7200.0 + 17.0 * 3610.0) / 3600.0;
    assert!(
        (e.extra_gpu_hours - want).abs() < 1e-6,
        "{e:?}, want {want}"
    );
}
