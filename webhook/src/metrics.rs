//! Prometheus metrics for the webhook server, exported through the operator's `/metrics`.
//!
//! [`Metrics`] is cheap to clone (every handle shares the same atomics); build one, pass clones to
//! [`crate::serve`] and [`crate::tls::CertStore::load`], and [`Metrics::register`] it once into
//! the operator's registry.

use std::{
    fmt::{self, Write as _},
    sync::atomic::AtomicI64,
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::{MatchedPath, Request, State},
    middleware::Next,
    response::Response,
};
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

/// The HTTP-style code an admission answer carried (`status.code`, or 200 when allowed), kept in
/// the response extensions for the metrics layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReviewCode(pub u16);

/// What an admission call decided; also the `decision` label of `webhook_requests_total`.
///
/// Review handlers put it into the response extensions so the metrics layer can read it without
/// parsing the body.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Decision {
    /// Allowed without changes.
    Allowed,
    /// Allowed with a JSON Patch.
    Patched,
    /// Denied by the rule (`allowed: false`, code 4xx).
    Denied,
    /// The call could not be judged: bad input, a panicking rule, a timeout.
    Error,
}

/// Why the server refused a connection or a request before it reached a route.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Rejection {
    /// The TLS handshake did not finish within the handshake timeout.
    HandshakeTimeout,
    /// The TLS handshake failed (bad client hello, old protocol version, no shared ALPN...).
    HandshakeFailed,
    /// No request began within the first-request timeout after the handshake.
    FirstRequestTimeout,
    /// The request head did not arrive within the header-read timeout.
    HeaderTimeout,
    /// The request body did not arrive within the body-read timeout.
    BodyTimeout,
    /// A connection without a request in flight was closed to admit a new one at the cap.
    Shed,
    /// The request was not answered within the whole-request timeout.
    RequestTimeout,
    /// The declared body was larger than the limit.
    BodyTooLarge,
}

impl Decision {
    /// The label value: `allowed`, `patched`, `denied` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Patched => "patched",
            Self::Denied => "denied",
            Self::Error => "error",
        }
    }
}

impl Rejection {
    /// Every reason, so each series exists at 0 from the start.
    pub const ALL: [Self; 5] = [
        Self::HandshakeTimeout,
        Self::HandshakeFailed,
        Self::HeaderTimeout,
        Self::RequestTimeout,
        Self::BodyTooLarge,
    ];

    /// The label value, snake case.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HandshakeTimeout => "handshake_timeout",
            Self::HandshakeFailed => "handshake_failed",
            Self::FirstRequestTimeout => "first_request_timeout",
            Self::HeaderTimeout => "header_timeout",
            Self::BodyTimeout => "body_timeout",
            Self::Shed => "shed",
            Self::RequestTimeout => "request_timeout",
            Self::BodyTooLarge => "body_too_large",
        }
    }
}

impl EncodeLabelValue for Decision {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

impl EncodeLabelValue for Rejection {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    path: String,
    decision: Decision,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectionLabels {
    reason: Rejection,
}

type HistogramFamily = Family<PathLabels, Histogram, fn() -> Histogram>;

/// The webhook's metric handles.
#[derive(Clone, Debug)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    duration: HistogramFamily,
    rejections: Family<RejectionLabels, Counter>,
    pub(crate) cert_reloads: Counter,
    pub(crate) cert_reload_errors: Counter,
    pub(crate) cert_not_after: Gauge<i64, AtomicI64>,
}

fn duration_histogram() -> Histogram {
    // 50 µs .. ~1.6 s: admission answers should take milliseconds; the tail shows trouble.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates unregistered metrics (all zero, every rejection reason among them).
    pub fn new() -> Self {
        let metrics = Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            rejections: Family::default(),
            cert_reloads: Counter::default(),
            cert_reload_errors: Counter::default(),
            cert_not_after: Gauge::default(),
        };
        for reason in Rejection::ALL {
            let _ = metrics
                .rejections
                .get_or_create(&RejectionLabels { reason });
        }
        metrics
    }

    /// Creates at 0 the request series a route at `path` answers with, so `rate()` sees their
    /// first increment: allowed (200), denied (422) on a validating route or patched (200) on a
    /// mutating one, and error for a bad request (400) or a failing rule (500). Rarer answers
    /// (413, 415, 408) appear when they first happen.
    pub fn declare_route(&self, path: &str, mutating: bool) {
        let judged = if mutating {
            (Decision::Patched, 200)
        } else {
            (Decision::Denied, 422)
        };
        for (decision, code) in [
            (Decision::Allowed, 200),
            judged,
            (Decision::Error, 400),
            (Decision::Error, 500),
        ] {
            let _ = self.requests.get_or_create(&RequestLabels {
                path: path.to_owned(),
                decision,
                code,
            });
        }
        let _ = self.duration.get_or_create(&PathLabels {
            path: path.to_owned(),
        });
    }

    /// Registers every metric under the `webhook_` prefix (within `registry`'s own prefix, if
    /// it has one).
    pub fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_prefix("webhook");
        registry.register(
            "requests",
            "Admission requests answered, by route path, decision and HTTP-style code",
            self.requests.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Time to answer an admission request, by route path",
            Unit::Seconds,
            self.duration.clone(),
        );
        registry.register(
            "rejections",
            "Connections or requests refused before reaching a route, by reason",
            self.rejections.clone(),
        );
        registry.register(
            "certificate_reloads",
            "Serving certificate pairs loaded after start",
            self.cert_reloads.clone(),
        );
        registry.register(
            "certificate_reload_errors",
            "Changed certificate pairs refused (unreadable, unparsable or mismatched)",
            self.cert_reload_errors.clone(),
        );
        registry.register_with_unit(
            "certificate_expiry_timestamp",
            "notAfter of the serving certificate, as a Unix timestamp",
            Unit::Seconds,
            self.cert_not_after.clone(),
        );
    }

    /// Counts one answered request.
    pub fn observe(&self, path: &str, decision: Decision, code: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                path: path.to_owned(),
                decision,
                code,
            })
            .inc();
        self.duration
            .get_or_create(&PathLabels {
                path: path.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Counts one refused connection or request.
    pub fn reject(&self, reason: Rejection) {
        self.rejections
            .get_or_create(&RejectionLabels { reason })
            .inc();
    }

    /// How many requests were answered on `path` with `decision` and `code` so far.
    pub fn requests(&self, path: &str, decision: Decision, code: u16) -> u64 {
        self.requests
            .get_or_create(&RequestLabels {
                path: path.to_owned(),
                decision,
                code,
            })
            .get()
    }

    /// How many connections or requests were refused for `reason` so far.
    pub fn rejections(&self, reason: Rejection) -> u64 {
        self.rejections
            .get_or_create(&RejectionLabels { reason })
            .get()
    }

    /// How many changed certificate pairs were refused so far.
    pub fn cert_reload_errors(&self) -> u64 {
        self.cert_reload_errors.get()
    }

    /// How many certificate pairs replaced the serving one after start.
    pub fn cert_reloads(&self) -> u64 {
        self.cert_reloads.get()
    }

    /// The serving certificate's `notAfter`, Unix seconds (0 before the first load).
    pub fn cert_not_after(&self) -> i64 {
        self.cert_not_after.get()
    }

    /// Wraps every route of `router` so each answer is counted and timed.
    ///
    /// The path label is the route pattern (never the raw URI, which would let callers create
    /// label values at will); the decision comes from the [`Decision`] response extension, or
    /// from the status when a handler set none.
    pub fn instrument(&self, router: Router) -> Router {
        if !router.has_routes() {
            // axum refuses a route layer on a router without routes.
            return router;
        }
        router.route_layer(axum::middleware::from_fn_with_state(self.clone(), record))
    }
}

async fn record(
    State(metrics): State<Metrics>,
    path: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let response = next.run(request).await;
    let path = path.as_ref().map_or("unmatched", MatchedPath::as_str);
    let decision = response.extensions().get::<Decision>().copied().unwrap_or(
        if response.status().is_success() {
            Decision::Allowed
        } else {
            Decision::Error
        },
    );
    let code = response
        .extensions()
        .get::<ReviewCode>()
        .map_or(response.status().as_u16(), |c| c.0);
    metrics.observe(path, decision, code, start.elapsed());
    response
}
