//! Per-project rate limits (`[limits]`): creates, deletes and cancels, and
//! gets and lists, per minute, per project and region — the batch API's
//! quotas, the same for every front end. GCRA through `governor`: a full
//! minute's allowance may come as a burst, then calls are spread. Over the
//! limit a call is refused RESOURCE_EXHAUSTED naming the limit, with when
//! to retry ([`RETRY_AFTER_SECONDS`]).

use std::num::NonZeroU32;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::Reason;
use super::error::RETRY_AFTER_SECONDS;
use super::{Engine, Error};
use crate::config::LimitsConfig;

/// The two limiters, keyed by (project, region).
pub(crate) struct RateLimits {
    mutations: DefaultKeyedRateLimiter<(String, String)>,
    reads: DefaultKeyedRateLimiter<(String, String)>,
    config: LimitsConfig,
}

impl RateLimits {
    pub(crate) fn new(config: &LimitsConfig) -> RateLimits {
        let per_minute = |n: u32| Quota::per_minute(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN));
        RateLimits {
            mutations: RateLimiter::keyed(per_minute(config.mutations_per_minute)),
            reads: RateLimiter::keyed(per_minute(config.reads_per_minute)),
            config: config.clone(),
        }
    }

    /// Counts a call; an error when over the limit.
    pub(crate) fn check(&self, project: &str, region: &str, read: bool) -> Result<(), Error> {
        let (limiter, per_minute, key, what) = if read {
            (
                &self.reads,
                self.config.reads_per_minute,
                "limits.reads_per_minute",
                "get/list",
            )
        } else {
            (
                &self.mutations,
                self.config.mutations_per_minute,
                "limits.mutations_per_minute",
                "create/delete/cancel",
            )
        };
        let bucket = (project.to_string(), region.to_string());
        match limiter.check_key(&bucket) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                let secs = wait.as_secs() + 1;
                tracing::info!(project, region, limit = key, "request refused: rate limit");
                Err(Error::new(Reason::RateLimitExceeded,
                    format!(
                        "project {project} in region {region} is over its {per_minute} {what} calls per minute ({key}); retry in {secs}s"
                    ),
                )
                .with_meta("limit", key)
                .with_meta(RETRY_AFTER_SECONDS, secs.to_string()))
            }
        }
    }

    /// Drops idle keys (called now and then so the maps stay small).
    pub(crate) fn shrink(&self) {
        self.mutations.retain_recent();
        self.reads.retain_recent();
    }
}

impl Engine {
    /// Counts a call to a project's region against its rate limit
    /// (`read`: a get or list; else a create, delete or cancel).
    pub(super) fn rate_limit(&self, project: &str, region: &str, read: bool) -> Result<(), Error> {
        self.live().limits.check(project, region, read)
    }
}
