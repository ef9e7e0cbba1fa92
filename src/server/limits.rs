//! Per-project rate limits (`[limits]`): creates, deletes and cancels, and
//! gets and lists, per minute, per project and region — the batch API's
//! quotas. GCRA through `governor`: a full minute's allowance may come as
//! a burst, then calls are spread. Over the limit a call is answered
//! RESOURCE_EXHAUSTED naming the limit, with `Retry-After`.

use std::num::NonZeroU32;

use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::api::Code;
use crate::config::LimitsConfig;
use crate::engine::Error;

/// The two limiters, keyed by (project, region).
pub struct RateLimits {
    mutations: DefaultKeyedRateLimiter<(String, String)>,
    reads: DefaultKeyedRateLimiter<(String, String)>,
    config: LimitsConfig,
}

impl RateLimits {
    pub fn new(config: &LimitsConfig) -> RateLimits {
        let per_minute = |n: u32| Quota::per_minute(NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN));
        RateLimits {
            mutations: RateLimiter::keyed(per_minute(config.mutations_per_minute)),
            reads: RateLimiter::keyed(per_minute(config.reads_per_minute)),
            config: config.clone(),
        }
    }

    /// Counts a call to a project route; an error when over the limit.
    /// `path` is `/v1/projects/{p}/locations|regions/{r}/...`.
    pub fn check(&self, method: &Method, path: &str) -> Result<(), Response> {
        let segments: Vec<&str> = path.split('/').collect();
        let (Some(project), Some(region)) = (segments.get(3), segments.get(5)) else {
            return Ok(());
        };
        let read = method == Method::GET || method == Method::HEAD;
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
                let mut response = Error::new(
                    Code::ResourceExhausted,
                    "RATE_LIMIT_EXCEEDED",
                    format!(
                        "project {project} in region {region} is over its {per_minute} {what} calls per minute ({key}); retry in {secs}s"
                    ),
                )
                .with_meta("limit", key)
                .into_response();
                if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                    response.headers_mut().insert(header::RETRY_AFTER, v);
                }
                Err(response)
            }
        }
    }

    /// Drops idle keys (called now and then so the maps stay small).
    pub fn shrink(&self) {
        self.mutations.retain_recent();
        self.reads.retain_recent();
    }
}
