//! The client side of the capacity queue: `flexq queues hold|resume|list`.

use reqwest::Method;
use serde_json::Value;

use super::{CliError, Client, OutputFormat, TargetArgs, print_structured, print_table, rows};

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
