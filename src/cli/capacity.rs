//! `flexq regions list`, `flexq nodes list|cordon|drain|uncordon`,
//! `flexq quotas list|set`, `flexq queues hold|resume|list`, `flexq usage`,
//! `flexq config diff|reload`.

use reqwest::Method;
use serde_json::Value;

use super::{CliError, Client, OutputFormat, TargetArgs, print_structured, print_table};

/// `flexq regions list`, `flexq nodes list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(subcommand)]
    pub action: ListAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum ListAction {
    /// List them.
    List,
}

/// `flexq quotas list|set`.
#[derive(Debug, clap::Args)]
pub struct QuotasArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(subcommand)]
    pub action: QuotasAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum QuotasAction {
    /// List limit and usage of every metric.
    List,
    /// Set one limit (admin). A lowered limit never revokes running work.
    Set {
        /// e.g. PREEMPTIBLE_NVIDIA_L4_GPUS
        metric: String,
        limit: u64,
    },
}

/// `flexq queues hold|resume|list`.
#[derive(Debug, clap::Args)]
pub struct QueuesArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(subcommand)]
    pub action: QueuesAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum QueuesAction {
    /// Hold the project's queue in the region (admin): nothing in it is
    /// allocated until it is resumed; deadlines keep counting.
    Hold {
        /// Every project's queue of the region.
        #[arg(long)]
        all_projects: bool,
    },
    /// Resume a held queue (admin).
    Resume {
        /// The region's own hold (a project held on its own stays held).
        #[arg(long)]
        all_projects: bool,
    },
    /// Every held queue (admin); with --project and --region, that queue.
    List,
}

/// `flexq queues hold|resume|list`.
pub async fn run_queues(args: QueuesArgs) -> Result<(), CliError> {
    let format = args.target.format;
    let one = |all: bool, t: TargetArgs| -> Result<(Client, String), CliError> {
        let region = t.region.clone();
        let client = if all {
            t.admin_client()?
        } else {
            t.project_client()?
        };
        let region = region.ok_or_else(|| {
            CliError::Usage("no region: pass --region or set FLEXQ_REGION".into())
        })?;
        let project = if all {
            "-".to_string()
        } else {
            client.target.project.clone()
        };
        Ok((
            client,
            format!("/v1/projects/{project}/regions/{region}/queue"),
        ))
    };
    let (client, path, method) = match args.action {
        QueuesAction::Hold { all_projects } => {
            let (c, p) = one(all_projects, args.target)?;
            (c, format!("{p}:hold"), Method::POST)
        }
        QueuesAction::Resume { all_projects } => {
            let (c, p) = one(all_projects, args.target)?;
            (c, format!("{p}:resume"), Method::POST)
        }
        QueuesAction::List if args.target.project.is_some() && args.target.region.is_some() => {
            let (c, p) = one(false, args.target)?;
            (c, p, Method::GET)
        }
        QueuesAction::List => {
            let c = args.target.admin_client()?;
            let v: Value = c.call::<(), _>(Method::GET, "/v1/queues", None).await?;
            let list = v["queues"].as_array().cloned().unwrap_or_default();
            return print_queues(&list, format);
        }
    };
    let v: Value = client.call::<(), _>(method, &path, None).await?;
    print_queues(&[v], format)
}

fn print_queues(list: &[Value], format: OutputFormat) -> Result<(), CliError> {
    if format != OutputFormat::Table {
        return print_structured(&list.to_vec(), format);
    }
    print_table(
        &[
            "REGION",
            "PROJECT",
            "HELD",
            "SINCE",
            "BY",
            "REGION_WIDE",
            "QUEUED",
        ],
        &rows(
            list,
            &[
                "region",
                "project",
                "held",
                "heldSince",
                "heldBy",
                "regionWide",
                "queuedBatches",
            ],
        ),
    );
    Ok(())
}

/// `flexq nodes list|cordon|drain|uncordon`.
#[derive(Debug, clap::Args)]
pub struct NodesArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(subcommand)]
    pub action: NodesAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum NodesAction {
    /// Every node, virtual ones marked, with what is free and its state.
    List,
    /// Take no new allocation on NODE (admin); what runs on it goes on.
    Cordon { node: String },
    /// Cordon NODE and show it drained once its running parts end (admin).
    Drain { node: String },
    /// Put NODE back into service (admin).
    Uncordon { node: String },
}

/// `flexq regions list`.
pub async fn run_regions(args: ListArgs) -> Result<(), CliError> {
    let ListAction::List = args.action;
    let format = args.target.format;
    regions(&args.target.admin_client()?, format).await
}

/// `flexq nodes list|cordon|drain|uncordon`.
pub async fn run_nodes(args: NodesArgs) -> Result<(), CliError> {
    let format = args.target.format;
    let client = args.target.admin_client()?;
    let (node, method) = match args.action {
        NodesAction::List => return nodes(&client, format).await,
        NodesAction::Cordon { node } => (node, "cordon"),
        NodesAction::Drain { node } => (node, "drain"),
        NodesAction::Uncordon { node } => (node, "uncordon"),
    };
    // Virtual nodes' ids hold slashes: one path segment, encoded.
    let path = format!("/v1/nodes/{}:{method}", node.replace('/', "%2F"));
    let v: Value = client.call::<(), _>(Method::POST, &path, None).await?;
    print_nodes(&[v], format)
}

/// `flexq quotas list|set`.
pub async fn run_quotas(args: QuotasArgs) -> Result<(), CliError> {
    let format = args.target.format;
    let client = args.target.project_client()?;
    match args.action {
        QuotasAction::List => quotas(&client, format).await,
        QuotasAction::Set { metric, limit } => set_quota(&client, &metric, limit, format).await,
    }
}

fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn rows(list: &[Value], keys: &[&str]) -> Vec<Vec<String>> {
    list.iter()
        .map(|item| keys.iter().map(|k| cell(&item[*k])).collect())
        .collect()
}

/// Capacity per region, zone and GPU type: total, allocated, free.
pub async fn regions(client: &Client, format: OutputFormat) -> Result<(), CliError> {
    let v: Value = client
        .call::<(), _>(Method::GET, "/v1/regions", None)
        .await?;
    let list = v["capacity"].as_array().cloned().unwrap_or_default();
    if format != OutputFormat::Table {
        return print_structured(&list, format);
    }
    print_table(
        &[
            "REGION",
            "ZONE",
            "ACCELERATOR",
            "NODES",
            "VIRTUAL",
            "GPUS",
            "ALLOCATED",
            "FREE",
            "FREE_SSD_GB",
        ],
        &rows(
            &list,
            &[
                "region",
                "zone",
                "accelerator",
                "nodes",
                "virtualNodes",
                "totalGpus",
                "allocatedGpus",
                "freeGpus",
                "freeLocalSsdGb",
            ],
        ),
    );
    Ok(())
}

/// Every node, virtual ones marked.
pub async fn nodes(client: &Client, format: OutputFormat) -> Result<(), CliError> {
    let v: Value = client.call::<(), _>(Method::GET, "/v1/nodes", None).await?;
    let list = v["nodes"].as_array().cloned().unwrap_or_default();
    print_nodes(&list, format)
}

fn print_nodes(list: &[Value], format: OutputFormat) -> Result<(), CliError> {
    if format != OutputFormat::Table {
        return print_structured(&list.to_vec(), format);
    }
    let mut table = rows(
        list,
        &[
            "id",
            "zone",
            "accelerator",
            "gpus",
            "freeGpus",
            "freeCores",
            "freeLocalSsdGb",
            "state",
        ],
    );
    for (row, node) in table.iter_mut().zip(list) {
        row.push(if node["virtual"] == true {
            "virtual (no agent, no GPU)".into()
        } else {
            "agent".into()
        });
    }
    print_table(
        &[
            "NODE",
            "ZONE",
            "ACCELERATOR",
            "GPUS",
            "FREE_GPUS",
            "FREE_CORES",
            "FREE_SSD_GB",
            "STATE",
            "KIND",
        ],
        &table,
    );
    Ok(())
}

/// A project's quotas in a region.
pub async fn quotas(client: &Client, format: OutputFormat) -> Result<(), CliError> {
    let path = format!(
        "/v1/projects/{}/regions/{}/quotas",
        client.target.project, client.target.region
    );
    let v: Value = client.call::<(), _>(Method::GET, &path, None).await?;
    print_quotas(&v, format)
}

/// Sets one quota limit (admin).
pub async fn set_quota(
    client: &Client,
    metric: &str,
    limit: u64,
    format: OutputFormat,
) -> Result<(), CliError> {
    let path = format!(
        "/v1/projects/{}/regions/{}/quotas",
        client.target.project, client.target.region
    );
    let body = serde_json::json!({ "metric": metric, "limit": limit });
    let v: Value = client.call(Method::PATCH, &path, Some(&body)).await?;
    print_quotas(&v, format)
}

fn print_quotas(v: &Value, format: OutputFormat) -> Result<(), CliError> {
    let list = v["quotas"].as_array().cloned().unwrap_or_default();
    if format != OutputFormat::Table {
        return print_structured(&list, format);
    }
    print_table(
        &["METRIC", "LIMIT", "USAGE"],
        &rows(&list, &["metric", "limit", "usage"]),
    );
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct UsageArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Start of the window, RFC 3339 (default: 7 days before the end).
    #[arg(long)]
    pub start: Option<String>,
    /// End of the window, RFC 3339 (default: now).
    #[arg(long)]
    pub end: Option<String>,
    /// Every project of the region (admins), instead of --project.
    #[arg(long)]
    pub all_projects: bool,
}

/// `flexq usage`: GPU-hours, batches, waits and expiries per project and
/// accelerator type in a region, like Slurm's sreport.
pub async fn run_usage(mut args: UsageArgs) -> Result<(), CliError> {
    if args.all_projects {
        args.target.project = Some("-".into());
    }
    let format = args.target.format;
    let client = args.target.project_client()?;
    let query: Vec<(&str, &str)> = [("startTime", &args.start), ("endTime", &args.end)]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
        .collect();
    let query = serde_urlencoded::to_string(&query).unwrap_or_default();
    let path = format!(
        "/v1/projects/{}/regions/{}/usage{}{query}",
        client.target.project,
        client.target.region,
        if query.is_empty() { "" } else { "?" }
    );
    let v: Value = client.call::<(), _>(Method::GET, &path, None).await?;
    if format != OutputFormat::Table {
        return print_structured(&v, format);
    }
    let hours = |x: &Value| format!("{:.2}", x.as_f64().unwrap_or_default());
    let seconds = |x: &Value| x.as_f64().map(|s| format!("{s:.1}s")).unwrap_or_default();
    let line = |r: &Value| {
        vec![
            cell(&r["project"]),
            cell(&r["acceleratorType"]),
            hours(&r["gpuHours"]),
            cell(&r["batches"]),
            seconds(&r["waitP50Seconds"]),
            seconds(&r["waitP95Seconds"]),
            format!("{:.1}", r["expiredPercent"].as_f64().unwrap_or_default()),
        ]
    };
    let mut table: Vec<Vec<String>> = v["rows"]
        .as_array()
        .map(|rows| rows.iter().map(line).collect())
        .unwrap_or_default();
    table.push(line(&v["total"]));
    println!(
        "{} from {} to {}",
        cell(&v["region"]),
        cell(&v["startTime"]),
        cell(&v["endTime"])
    );
    print_table(
        &[
            "PROJECT",
            "ACCELERATOR",
            "GPU-HOURS",
            "BATCHES",
            "WAIT-P50",
            "WAIT-P95",
            "EXPIRED-%",
        ],
        &table,
    );
    Ok(())
}

/// `flexq config diff|reload`: the server reads its config file again.
#[derive(Debug, clap::Args)]
pub struct ConfigRemoteArgs {
    #[command(flatten)]
    pub target: TargetArgs,
}

/// `flexq config diff` (`apply` false: what a reload would change) and
/// `flexq config reload` (admins).
pub async fn run_config(args: ConfigRemoteArgs, apply: bool) -> Result<(), CliError> {
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
