//! The client side of capacity: `flexq regions list`,
//! `flexq nodes list|cordon|drain|uncordon`, `flexq quotas list|set`,
//! `flexq usage`.

use reqwest::Method;
use serde_json::Value;

use super::{
    CliError, Client, OutputFormat, TargetArgs, cell, print_structured, print_table, rows,
};

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
            hours(&r["weightedGpuHours"]),
            hours(&r["lostGpuHours"]),
            hours(&r["reclaimedGpuHours"]),
            hours(&r["extraGpuHours"]),
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
            "WEIGHTED",
            "LOST",
            "RECLAIMED",
            "EXTRA",
            "BATCHES",
            "WAIT-P50",
            "WAIT-P95",
            "EXPIRED-%",
        ],
        &table,
    );
    Ok(())
}
