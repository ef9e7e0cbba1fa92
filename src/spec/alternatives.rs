//! Placement alternatives (docs/rules.md#placement-alternatives):
//! where else a queued batch may run once it has waited a while, and the
//! batch it becomes there. An alternative is one change to the batch's own
//! placement — another GPU type in its region, another region, or
//! on-demand quota — with a delay after which it may be tried. The
//! operator sets default alternatives in config; a batch may opt out or name
//! its own within what the operator allows.
//!
//! An alternative is a whole batch: [`reshape`] rewrites the batch's properties
//! for the new GPU type (cores, GPUs per node, executors, memory and disk
//! from the type's table), and the result passes the same rules as any
//! create. What Spark receives on an alternative is that batch.

use std::collections::BTreeMap;
use std::fmt;

use super::{
    Accelerator, ClusterRequest, PartRole, Policy, ProvisioningMode, Rejection, check_create,
    property_field,
};
use crate::api::{Batch, quote};

pub use super::request::Alternative;
pub use super::target::{AlternativeSpec, Target};

/// The property through which a batch opts out (`none`) or names its own
/// alternatives. A `spark.*` key, so that every Dataproc client sends it
/// unchanged and Spark ignores it.
pub const ALTERNATIVES_PROPERTY: &str = "spark.flexq.alternatives";

/// The most alternatives a batch may have.
pub const MAX_ALTERNATIVES: usize = 4;

/// The accepted form of a batch's alternatives, for error messages.
pub const ALTERNATIVES_FORM: &str = "\"none\", or up to 4 comma-separated rungs, each \"GPU_TYPE after DELAY\", \"region REGION after DELAY\" or \"on-demand after DELAY\" (DELAY like 15m)";

/// Parses an alternative's target: `a100-40`, `region europe-west4`, `on-demand`.
pub fn parse_target(text: &str) -> Result<Target, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        ["region", name] => Ok(Target::Region((*name).to_string())),
        ["on-demand"] => Ok(Target::OnDemand),
        [gpu] => Accelerator::parse(gpu)
            .map(Target::Accelerator)
            .ok_or_else(|| {
                format!(
                    "GPU type {} is not supported; accepted: {}",
                    quote(gpu),
                    Accelerator::accepted_names()
                )
            }),
        _ => Err(format!(
            "{} is not a target: use a GPU type, \"region REGION\" or \"on-demand\"",
            quote(text.trim())
        )),
    }
}

/// Parses one alternative: `a100-40 after 15m`, `region europe-west4 after 30m`,
/// `on-demand after 20m`.
pub fn parse_alternative(text: &str) -> Result<AlternativeSpec, String> {
    let alternative = quote(text.trim());
    let words: Vec<&str> = text.split_whitespace().collect();
    let (target, delay) = match words.as_slice() {
        [target @ .., "after", delay] if !target.is_empty() => (target.join(" "), *delay),
        _ => {
            return Err(format!(
                "rung {alternative} is not of the form \"GPU_TYPE after DELAY\", \"region REGION after DELAY\" or \"on-demand after DELAY\""
            ));
        }
    };
    let target = parse_target(&target).map_err(|e| format!("rung {alternative}: {e}"))?;
    let after = humantime::parse_duration(delay).map_err(|e| {
        format!(
            "rung {alternative}: delay {} is not a duration like 15m ({e})",
            quote(delay)
        )
    })?;
    Ok(AlternativeSpec {
        target,
        after_s: after.as_secs(),
    })
}

/// Parses a batch's alternatives: comma-separated, at most [`MAX_ALTERNATIVES`]; `none`
/// is the empty alternatives.
pub fn parse_alternatives(text: &str) -> Result<Vec<AlternativeSpec>, String> {
    let text = text.trim();
    if text == "none" {
        return Ok(Vec::new());
    }
    let alternatives = text
        .split(',')
        .map(parse_alternative)
        .collect::<Result<Vec<_>, _>>()?;
    if alternatives.len() > MAX_ALTERNATIVES {
        return Err(format!(
            "{} rungs given; at most {MAX_ALTERNATIVES} are accepted",
            alternatives.len()
        ));
    }
    Ok(alternatives)
}

/// An operator's alternatives: the batches it applies to (each filter absent:
/// any), its alternatives, and the further targets a batch may name itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlternativesRule {
    pub region: Option<String>,
    pub project: Option<String>,
    pub accelerator: Option<Accelerator>,
    pub alternatives: Vec<AlternativeSpec>,
    pub allow: Vec<Target>,
    /// When a loan taken through these alternatives may be taken back by
    /// the capacity's own users.
    pub reclaim: Reclaim,
}

/// When the owners of lent capacity may take it back from a batch that
/// runs on it as a loan (docs/rules.md#loans-and-reclaim): config key
/// `reclaim`, `"after 10m"` or `"never"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaim {
    /// Once the loan has run this long (its minimum run).
    After(std::time::Duration),
    /// Never: the loan runs to its end.
    Never,
}

/// A loan runs at least this long before its owners may take it back,
/// where the operator's entry does not say.
pub const DEFAULT_RECLAIM_AFTER: std::time::Duration = std::time::Duration::from_secs(10 * 60);

impl Default for Reclaim {
    fn default() -> Reclaim {
        Reclaim::After(DEFAULT_RECLAIM_AFTER)
    }
}

impl fmt::Display for Reclaim {
    /// The form the config takes: `after 10m`, `never`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reclaim::After(d) => write!(f, "after {}", humantime::format_duration(*d)),
            Reclaim::Never => f.write_str("never"),
        }
    }
}

/// The accepted form of `reclaim`, for error messages.
pub const RECLAIM_FORM: &str = "\"never\" or \"after DURATION\" (like \"after 10m\")";

/// Parses a reclaim rule: `after 10m` or `never`.
pub fn parse_reclaim(text: &str) -> Result<Reclaim, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        ["never"] => Ok(Reclaim::Never),
        ["after", d] => humantime::parse_duration(d)
            .map(Reclaim::After)
            .map_err(|e| format!("{} is not a duration like 10m ({e})", quote(d))),
        _ => Err(format!(
            "{} is not accepted; use {RECLAIM_FORM}",
            quote(text)
        )),
    }
}

impl AlternativesRule {
    fn matches(&self, project: &str, region: &str, accelerator: Option<Accelerator>) -> bool {
        self.region.as_deref().is_none_or(|r| r == region)
            && self.project.as_deref().is_none_or(|p| p == project)
            && self.accelerator.is_none_or(|a| Some(a) == accelerator)
    }

    fn specificity(&self) -> usize {
        usize::from(self.region.is_some())
            + usize::from(self.project.is_some())
            + usize::from(self.accelerator.is_some())
    }

    /// Whether a batch may name `target` under this alternatives.
    fn allows(&self, target: &Target) -> bool {
        self.alternatives.iter().any(|r| &r.target == target) || self.allow.contains(target)
    }
}

/// The operator's alternatives for a batch: the most specific that matches (the
/// first of equals, in config order).
pub fn rule_for<'a>(
    alternative_rules: &'a [AlternativesRule],
    project: &str,
    region: &str,
    own: &ClusterRequest,
) -> Option<&'a AlternativesRule> {
    rule_matching(alternative_rules, project, region, own.accelerator())
}

/// The most specific of `alternative_rules` for a batch of `project` in
/// `region` whose own GPU type is `accelerator` (the first of equals).
pub fn rule_matching<'a>(
    alternative_rules: &'a [AlternativesRule],
    project: &str,
    region: &str,
    accelerator: Option<Accelerator>,
) -> Option<&'a AlternativesRule> {
    let mut best: Option<&AlternativesRule> = None;
    for l in alternative_rules
        .iter()
        .filter(|l| l.matches(project, region, accelerator))
    {
        if best.is_none_or(|b| l.specificity() > b.specificity()) {
            best = Some(l);
        }
    }
    best
}

/// An alternative of the operator's alternatives that does not apply to a batch, and
/// why: shown by validate-only, never an error (the batch did not ask).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub alternative: AlternativeSpec,
    pub why: String,
}

/// A batch's alternatives: its own alternatives (property [`ALTERNATIVES_PROPERTY`]),
/// each alternative allowed by the operator's alternatives, or else the operator's.
/// An alternative the batch named that can never be valid is an error naming it;
/// one of the operator's that does not apply is skipped, with the reason.
/// Default-mode batches never wait, so they have no alternatives.
pub fn resolve(
    batch: &Batch,
    own: &ClusterRequest,
    project: &str,
    region: &str,
    policy: &Policy,
) -> Result<(Vec<Alternative>, Vec<Skipped>), Rejection> {
    let field = property_field(ALTERNATIVES_PROPERTY);
    let rule = rule_for(&policy.alternative_rules, project, region, own);
    let asked = batch
        .properties()
        .get(ALTERNATIVES_PROPERTY)
        .map(|v| (v.clone(), parse_alternatives(v)));
    let reject = |description: String| Rejection {
        code: crate::api::Code::InvalidArgument,
        violations: vec![crate::api::FieldViolation {
            field: field.clone(),
            description,
        }],
    };
    let (specs, own_alternatives) = match asked {
        Some((value, Err(e))) => {
            return Err(reject(format!(
                "{} is not a ladder: {e}; accepted: {ALTERNATIVES_FORM}",
                quote(&value)
            )));
        }
        Some((_, Ok(specs))) => (specs, true),
        None => (
            rule.map(|l| l.alternatives.clone()).unwrap_or_default(),
            false,
        ),
    };
    if own.mode == ProvisioningMode::Default {
        if own_alternatives && !specs.is_empty() {
            return Err(reject(
                "a batch in provisioning mode \"default\" is allocated at once or refused, so it has no alternatives; use queue mode (runtime 3.0+) or \"none\"".into(),
            ));
        }
        return Ok((Vec::new(), Vec::new()));
    }
    let mut alternatives = Vec::new();
    let mut skipped = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let why = why_not(spec, &specs[..i], own, region, policy).or_else(|| {
            (own_alternatives && !rule.is_some_and(|l| l.allows(&spec.target)))
                .then(|| not_allowed(spec, rule))
        });
        let shaped = match why {
            Some(why) => Err(why),
            None => check_alternative(batch, own, spec, project, region, policy),
        };
        match shaped {
            Ok((alternative_region, cluster)) => alternatives.push(Alternative {
                index: alternatives.len() as u32 + 1,
                after_s: spec.after_s,
                target: spec.target.clone(),
                region: alternative_region,
                cluster,
            }),
            Err(why) if own_alternatives => {
                return Err(reject(format!("rung {} ({spec}): {why}", i + 1)));
            }
            Err(why) => skipped.push(Skipped {
                alternative: spec.clone(),
                why,
            }),
        }
    }
    Ok((alternatives, skipped))
}

/// Why a batch may not name an alternative its operator's alternatives do
/// not allow, listing those they allow.
fn not_allowed(spec: &AlternativeSpec, rule: Option<&AlternativesRule>) -> String {
    let allowed: Vec<String> = rule
        .map(|l| {
            l.alternatives
                .iter()
                .map(|r| r.target.to_string())
                .chain(l.allow.iter().map(ToString::to_string))
                .collect()
        })
        .unwrap_or_default();
    format!(
        "the operator does not allow {} for this batch; allowed: {}",
        spec.target,
        if allowed.is_empty() {
            "none".to_string()
        } else {
            allowed.join(", ")
        }
    )
}

/// The batch reshaped for an alternative and checked by every rule but
/// the alternatives: the alternative's region and cluster request, or why
/// it is invalid.
fn check_alternative(
    batch: &Batch,
    own: &ClusterRequest,
    spec: &AlternativeSpec,
    project: &str,
    region: &str,
    policy: &Policy,
) -> Result<(String, ClusterRequest), String> {
    let alternative_region = match &spec.target {
        Target::Region(r) => r.as_str(),
        _ => region,
    };
    let ids = super::Identifiers::default();
    check_create(
        &reshape(batch, own, &spec.target),
        ids,
        project,
        alternative_region,
        policy,
    )
    .map(|cluster| (alternative_region.to_string(), cluster))
    .map_err(|r| format!("as a batch it is invalid: {}", r.message()))
}

/// Why an alternative can never be tried for a batch, if so: a delay past the
/// allocation timeout, the batch's own placement again, an alternative named
/// twice, a region not served or a GPU type the region does not offer.
fn why_not(
    spec: &AlternativeSpec,
    before: &[AlternativeSpec],
    own: &ClusterRequest,
    region: &str,
    policy: &Policy,
) -> Option<String> {
    if spec.after_s >= own.allocation_timeout_s {
        return Some(format!(
            "its delay of {}s is not within the batch's allocation timeout of {}s, so it would never be tried",
            spec.after_s, own.allocation_timeout_s
        ));
    }
    if before.iter().any(|b| b.target == spec.target) {
        return Some(format!(
            "{} is named twice; each target may appear once",
            spec.target
        ));
    }
    match &spec.target {
        Target::Accelerator(a) => {
            let own_type = own.accelerator();
            if own_type.is_none() {
                return Some("the batch uses no GPU, so it has no GPU type to change".into());
            }
            if own_type == Some(*a) {
                return Some(format!("{a} is the batch's own GPU type"));
            }
        }
        Target::Region(r) => {
            if r == region {
                return Some(format!("{r} is the batch's own region"));
            }
            if !policy.regions.contains_key(r) {
                return Some(super::not_served(r, policy.regions.keys()));
            }
        }
        Target::OnDemand => {}
    }
    None
}

/// The batch as it would be on `target`: for another GPU type, every part
/// of the batch's own type moves to it with the node shape the type's
/// table gives (the largest GPU count per node not above the original,
/// then the core count nearest the original), as many executors as keep
/// the cluster's GPUs, the disk and GPU amounts the shape's defaults give,
/// and the owner's memory where the new shape holds it (else the shape's
/// default); for on-demand, provisioning mode `default`; for another
/// region, the same batch. The caller validates the result.
pub fn reshape(batch: &Batch, own: &ClusterRequest, target: &Target) -> Batch {
    let mut out = batch.clone();
    let Some(rc) = out.runtime_config.as_mut() else {
        return out;
    };
    let props = &mut rc.properties;
    props.remove(ALTERNATIVES_PROPERTY);
    match target {
        Target::Region(_) => {}
        Target::OnDemand => {
            for key in [
                "spark.dataproc.driver.provisioning.mode",
                "spark.dataproc.executor.provisioning.mode",
            ] {
                props.insert(key.into(), "default".into());
            }
        }
        Target::Accelerator(to) => {
            let from = own.accelerator();
            for (role, shape) in [
                (PartRole::Executor, &own.executor),
                (PartRole::Driver, &own.driver),
            ] {
                if shape.accelerator.is_none() || shape.accelerator != from {
                    continue;
                }
                let (cores, gpus) = translate(shape.gpus, shape.cores, *to);
                let part = role.name();
                props.insert(role.accelerator_key().into(), to.name().into());
                props.insert(format!("spark.{part}.cores"), cores.to_string());
                for key in [
                    format!("spark.dataproc.{part}.disk.size"),
                    format!("spark.{part}.resource.gpu.amount"),
                ] {
                    props.remove(&key);
                }
                // The owner's memory setting stays where the new shape
                // holds it (with the 1024m the other part needs); else the
                // shape's default split applies.
                let max = to.max_total_memory_mb(cores).unwrap_or(0);
                for key in [
                    format!("spark.{part}.memory"),
                    format!("spark.{part}.memoryOverhead"),
                ] {
                    let fits = props
                        .get(&key)
                        .and_then(|v| super::parse_memory_mb(v.trim()).ok())
                        .is_some_and(|mb| mb <= max.saturating_sub(1024));
                    if !fits {
                        props.remove(&key);
                    }
                }
                if role == PartRole::Executor {
                    props.remove("spark.task.resource.gpu.amount");
                    let total = u64::from(own.executor_count) * u64::from(shape.gpus);
                    let count = total.div_ceil(u64::from(gpus.max(1)));
                    props.insert("spark.executor.instances".into(), count.to_string());
                    // With dynamic allocation the alternative's executors are the
                    // gang Spark starts with (never fewer than the own
                    // placement's: an alternative's node has at most as many GPUs),
                    // so a maxExecutors below them is raised to them.
                    let below = |v: &String| v.trim().parse::<u64>().map_or(true, |n| n < count);
                    if own.dynamic_allocation
                        && props.get(super::MAX_EXECUTORS_KEY).is_some_and(below)
                    {
                        props.insert(super::MAX_EXECUTORS_KEY.into(), count.to_string());
                    }
                }
            }
        }
    }
    out
}

/// The batch and cluster a batch runs as once allocated on `alternative` (0: its
/// own placement): on an alternative, the reshaped batch, whose properties are
/// what Spark receives, and the alternative's cluster.
pub fn as_placed(
    batch: &Batch,
    own: &ClusterRequest,
    alternatives: &[Alternative],
    index: u32,
) -> (Batch, ClusterRequest) {
    match index
        .checked_sub(1)
        .and_then(|i| alternatives.get(i as usize))
    {
        Some(a) => (reshape(batch, own, &a.target), a.cluster.clone()),
        None => (batch.clone(), own.clone()),
    }
}

/// A node of `gpus` GPUs and `cores` cores on GPU type `to`: the largest
/// GPU count per node `to` offers that is not above `gpus` (else its
/// smallest), then the core count nearest `cores` among its shapes with
/// that many GPUs (the larger on a tie). Answers (cores, GPUs).
pub fn translate(gpus: u32, cores: u32, to: Accelerator) -> (u32, u32) {
    let shapes: Vec<(u32, u32)> = to
        .allowed_cores()
        .into_iter()
        .filter_map(|c| to.gpus_for_cores(c).map(|g| (c, g)))
        .collect();
    let per_node = shapes
        .iter()
        .map(|s| s.1)
        .filter(|g| *g <= gpus)
        .max()
        .or_else(|| shapes.iter().map(|s| s.1).min())
        .unwrap_or(1);
    shapes
        .iter()
        .filter(|s| s.1 == per_node)
        .min_by_key(|s| (s.0.abs_diff(cores), std::cmp::Reverse(s.0)))
        .map_or((to.default_cores(), per_node), |s| *s)
}

/// An `[[alternatives]]` entry of the config, checked: each alternative and target parses, the
/// filter names a known GPU type. Answers the alternatives, or the key that is
/// wrong (`accelerator`, `alternatives`, `allow`) and what is wrong with it.
pub fn rule_from_config(
    region: Option<&str>,
    project: Option<&str>,
    accelerator: Option<&str>,
    alternatives: &[String],
    allow: &[String],
    reclaim: Option<&str>,
) -> Result<AlternativesRule, (&'static str, String)> {
    let accelerator = match accelerator {
        None => None,
        Some(a) => Some(Accelerator::parse(a).ok_or_else(|| {
            (
                "accelerator",
                format!(
                    "{} is not a GPU type; accepted: {}",
                    quote(a),
                    Accelerator::accepted_names()
                ),
            )
        })?),
    };
    if alternatives.len() > MAX_ALTERNATIVES {
        return Err((
            "rungs",
            format!(
                "{} rungs given; at most {MAX_ALTERNATIVES} are accepted",
                alternatives.len()
            ),
        ));
    }
    let alternatives = alternatives
        .iter()
        .map(|r| parse_alternative(r))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ("rungs", e))?;
    let allow = allow
        .iter()
        .map(|t| parse_target(t))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ("allow", e))?;
    let reclaim = reclaim
        .map(parse_reclaim)
        .transpose()
        .map_err(|e| ("reclaim", e))?
        .unwrap_or_default();
    Ok(AlternativesRule {
        region: region.map(str::to_string),
        project: project.map(str::to_string),
        accelerator,
        alternatives,
        allow,
        reclaim,
    })
}

/// Every alternative's target for a pair of types, for docs and tests: what an
/// executor of `cores` cores on `from` becomes on `to`.
pub fn translation_table() -> BTreeMap<(Accelerator, u32, Accelerator), (u32, u32)> {
    let mut table = BTreeMap::new();
    for from in Accelerator::ALL {
        for cores in from.allowed_cores() {
            let gpus = from.gpus_for_cores(cores).unwrap_or(1);
            for to in Accelerator::ALL {
                if to != from {
                    table.insert((from, cores, to), translate(gpus, cores, to));
                }
            }
        }
    }
    table
}

#[cfg(test)]
mod tests;
