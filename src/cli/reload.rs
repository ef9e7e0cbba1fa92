//! The client side of the config's reload: `flexq config diff|reload`
//! ask the server to read its config file again.

use reqwest::Method;
use serde_json::Value;

use super::{CliError, OutputFormat, TargetArgs, print_structured, print_table};

/// `flexq config diff|reload`: the server reads its config file again.
#[derive(Debug, clap::Args)]
pub struct ConfigRemoteArgs {
    #[command(flatten)]
    pub target: TargetArgs,
}

/// `flexq config diff` (`apply` false: what a reload would change) and
/// `flexq config reload` (admins).
pub(crate) async fn run_config(args: ConfigRemoteArgs, apply: bool) -> Result<(), CliError> {
    let format = args.target.format;
    let client = args.target.admin_client()?;
    let path = if apply {
        "/v1/config:reload"
    } else {
        "/v1/config:reload?validateOnly=true"
    };
    let v: Value = client.call::<(), _>(Method::POST, path, None).await?;
    if format != OutputFormat::Table {
        return print_structured(&v, format);
    }
    let changes = v["changes"].as_array().cloned().unwrap_or_default();
    let pending = v["pendingRestart"].as_array().cloned().unwrap_or_default();
    let (before, after) = (&v["previousGeneration"], &v["generation"]);
    match (apply, changes.is_empty()) {
        (false, true) => println!(
            "no live change: the server's config file is the config in force (generation {before})"
        ),
        (false, false) => println!("a reload would change (generation {before} in force now):"),
        (true, true) => println!("reloaded: nothing live changed (generation {after})"),
        (true, false) => println!("reloaded: generation {before} -> {after}"),
    }
    let table = |list: &[Value]| {
        let rows: Vec<Vec<String>> = list
            .iter()
            .map(|c| {
                ["key", "from", "to"]
                    .iter()
                    .map(|k| c[*k].as_str().unwrap_or("(absent)").to_string())
                    .collect()
            })
            .collect();
        print_table(&["KEY", "FROM", "TO"], &rows);
    };
    if !changes.is_empty() {
        table(&changes);
    }
    if !pending.is_empty() {
        println!("\nrestart-only keys that differ (they take effect at the next start):");
        table(&pending);
    }
    for (key, what) in [
        ("retiredNodes", "retired (no new work)"),
        ("restoredNodes", "schedulable again"),
        ("addedNodes", "added"),
        ("removedNodes", "removed"),
    ] {
        if let Some(nodes) = v[key].as_array().filter(|n| !n.is_empty()) {
            let names: Vec<&str> = nodes.iter().filter_map(Value::as_str).collect();
            println!("nodes {what}: {}", names.join(", "));
        }
    }
    Ok(())
}
