// The Grafana dashboard the chart ships (`charts/eureka-operator/files/grafana-dashboard.json`),
// rendered from the table in `rows()`: rows of panels, each with its PromQL. The queries are
// written without selectors; `filtered` gives every `eureka_*` and `process_*` series the
// dashboard's `job` and `instance` variables, so no panel can forget them. `docgen --write`
// writes the file, `docgen --dashboard-queries` prints every panel's expression (one a line, the
// integration test evaluates them against a real Prometheus), and the unit tests below check the
// committed file and the rules the queries follow.

use serde_json::{Value, json};

/// The file name (under the chart's `files/`, or the directory given to `--write`).
pub const FILE: &str = "grafana-dashboard.json";

/// Where the dashboard is committed, from the repository's root.
pub const CHART_PATH: &str = "charts/eureka-operator/files/grafana-dashboard.json";

/// The matchers every series of the dashboard carries.
const SELECTOR: &str = r#"job=~"$job", instance=~"$instance""#;

/// The layout grid's width.
const COLUMNS: u32 = 24;

/// The window of every `rate()` and `increase()`.
const WINDOW: &str = "[5m]";

/// A panel's height unless it sets another.
const HEIGHT: u32 = 8;

/// How a panel shows its queries.
enum Kind {
    /// Lines over time.
    Series,
    /// Lines over time on a logarithmic axis (values far apart: open and maximum descriptors).
    LogSeries,
    /// The latest value of each series on a tile coloured by the state the value names.
    Stat(&'static [State]),
    /// The latest values as table rows: the columns kept, each with its header.
    Table(&'static [(&'static str, &'static str)]),
}

/// What a 0/1 gauge's value means on a stat tile.
struct State {
    value: i64,
    text: &'static str,
    color: &'static str,
}

const fn state(value: i64, text: &'static str, color: &'static str) -> State {
    State { value, text, color }
}

/// One query of a panel.
struct Target {
    expr: String,
    legend: String,
    /// Drawn dashed: a limit the other lines are measured against.
    dashed: bool,
}

fn q(expr: &str, legend: &str) -> Target {
    Target {
        expr: expr.to_string(),
        legend: legend.to_string(),
        dashed: false,
    }
}

/// A limit drawn as a dashed line.
fn limit(expr: &str, legend: &str) -> Target {
    Target {
        dashed: true,
        ..q(expr, legend)
    }
}

/// Quantiles of a histogram over the window, as lines: `bucket` is the `_bucket` series (with
/// any matchers of its own), `by` the labels each line keeps besides `le` (may be empty), and
/// `legend` what follows `p50 `, `p99 `.
fn quantiles(qs: &[f64], bucket: &str, by: &str, legend: &str) -> Vec<Target> {
    let by = if by.is_empty() {
        "le".to_string()
    } else {
        format!("le, {by}")
    };
    qs.iter()
        .map(|quantile| {
            let p = (quantile * 100.0).round();
            q(
                &format!("histogram_quantile({quantile}, sum by ({by}) (rate({bucket}{WINDOW})))"),
                format!("p{p} {legend}").trim_end(),
            )
        })
        .collect()
}

struct Panel {
    title: &'static str,
    description: &'static str,
    kind: Kind,
    unit: &'static str,
    width: u32,
    height: u32,
    targets: Vec<Target>,
}

fn panel(
    kind: Kind,
    title: &'static str,
    unit: &'static str,
    width: u32,
    description: &'static str,
    targets: Vec<Target>,
) -> Panel {
    Panel {
        title,
        description,
        kind,
        unit,
        width,
        height: HEIGHT,
        targets,
    }
}

impl Panel {
    fn height(self, height: u32) -> Panel {
        Panel { height, ..self }
    }
}

struct Row {
    title: &'static str,
    panels: Vec<Panel>,
}

const UP_DOWN: &[State] = &[state(0, "down", "red"), state(1, "up", "green")];
const OFF_ACTIVE: &[State] = &[state(0, "off", "green"), state(1, "active", "orange")];
const STANDBY_LEADER: &[State] = &[state(0, "standby", "blue"), state(1, "leader", "green")];
const READY: &[State] = &[state(0, "not ready", "red"), state(1, "ready", "green")];
const FAILING: &[State] = &[state(0, "ok", "green"), state(1, "failing", "red")];
const WITHDRAWN: &[State] = &[state(0, "shown", "green"), state(1, "withdrawn", "orange")];

/// The HTTP latency histogram's `_bucket` series (endpoint, method, status).
const HTTP: &str = "eureka_http_request_duration_seconds_bucket";

/// The dashboard: rows of panels, each line of panels filling the 24 columns.
fn rows() -> Vec<Row> {
    use Kind::*;
    let requests = format!(r#"{HTTP}{{le="+Inf"}}"#);
    let errors = format!(r#"{HTTP}{{le="+Inf", status=~"5.."}}"#);
    vec![
        Row {
            title: "Registry",
            panels: vec![
                panel(
                    Series,
                    "Instances by status",
                    "short",
                    8,
                    "Instances in each replica's registry by status. Replication keeps the replicas' \
                     registries alike, so one replica's lines parting from the others' point at a \
                     replication problem.",
                    vec![q(
                        "sum by (instance, status) (eureka_instances_by_status)",
                        "{{status}} · {{instance}}",
                    )],
                ),
                panel(
                    Series,
                    "Instances by origin",
                    "short",
                    8,
                    "Instances in each replica's registry by where they came from (the origin label).",
                    vec![q(
                        "sum by (instance, origin) (eureka_instances)",
                        "{{origin}} · {{instance}}",
                    )],
                ),
                panel(
                    Series,
                    "Applications",
                    "short",
                    8,
                    "Applications with at least one instance, per replica.",
                    vec![q("sum by (instance) (eureka_applications)", "{{instance}}")],
                ),
                panel(
                    Series,
                    "Renewals per minute vs threshold",
                    "short",
                    12,
                    "Heartbeats received in the last complete minute (solid) and the count at or below \
                     which self-preservation stops expiring leases (dashed). A solid line falling to its \
                     dashed one means clients stopped renewing, or cannot reach this replica.",
                    vec![
                        q(
                            "sum by (instance) (eureka_renewals_per_minute)",
                            "renewals · {{instance}}",
                        ),
                        limit(
                            "sum by (instance) (eureka_renewals_per_minute_threshold)",
                            "threshold · {{instance}}",
                        ),
                    ],
                ),
                panel(
                    Stat(OFF_ACTIVE),
                    "Self-preservation",
                    "short",
                    4,
                    "Whether self-preservation currently keeps each replica from expiring leases.",
                    vec![q("max by (instance) (eureka_self_preservation_active)", "{{instance}}")],
                ),
                panel(
                    Series,
                    "Expired leases not evicted",
                    "short",
                    8,
                    "Leases past their duration that are still in the registry: the eviction run has \
                     not reached them yet, or self-preservation holds them.",
                    vec![q("sum by (instance) (eureka_expired_leases)", "{{instance}}")],
                ),
                panel(
                    Series,
                    "Registrations, cancellations, evictions",
                    "ops",
                    12,
                    "Per second over 5 minutes, per replica: registrations (from clients, peers and pods), \
                     cancellations by their owners, and evictions of expired leases.",
                    vec![
                        q(
                            "sum by (instance) (rate(eureka_registrations_total[5m]))",
                            "registrations · {{instance}}",
                        ),
                        q(
                            "sum by (instance) (rate(eureka_cancellations_total[5m]))",
                            "cancellations · {{instance}}",
                        ),
                        q(
                            "sum by (instance) (rate(eureka_evictions_total[5m]))",
                            "evictions · {{instance}}",
                        ),
                    ],
                ),
                panel(
                    Series,
                    "Writes refused by a limit",
                    "ops",
                    12,
                    "Writes refused per second because they exceed a configured cap, by cap. Each one \
                     is an instance or a change the registry does not hold.",
                    vec![q(
                        "sum by (instance, limit) (rate(eureka_limit_refusals_total[5m]))",
                        "{{limit}} · {{instance}}",
                    )],
                ),
            ],
        },
        Row {
            title: "Clients / HTTP",
            panels: vec![
                panel(
                    Series,
                    "Fetch latency (p50, p99)",
                    "s",
                    12,
                    "How long clients wait for the registry: full (`apps`) and delta (`apps_delta`) \
                     fetches, median and 99th percentile over 5 minutes.",
                    quantiles(
                        &[0.5, 0.99],
                        &format!(r#"{HTTP}{{endpoint=~"apps|apps_delta", method="GET"}}"#),
                        "endpoint",
                        "{{endpoint}}",
                    ),
                ),
                panel(
                    Series,
                    "Heartbeat latency (p50, p99)",
                    "s",
                    12,
                    "How long lease renewals (`PUT` on an instance) take, median and 99th percentile \
                     over 5 minutes.",
                    quantiles(
                        &[0.5, 0.99],
                        &format!(r#"{HTTP}{{endpoint="instance", method="PUT"}}"#),
                        "endpoint",
                        "heartbeat",
                    ),
                ),
                panel(
                    Series,
                    "Requests by endpoint and status",
                    "reqps",
                    12,
                    "Eureka API requests per second over 5 minutes, by endpoint and HTTP status, across \
                     the selected replicas.",
                    vec![q(
                        &format!("sum by (endpoint, status) (rate({requests}{WINDOW}))"),
                        "{{endpoint}} {{status}}",
                    )],
                ),
                panel(
                    Series,
                    "Latency p99 by endpoint",
                    "s",
                    12,
                    "The 99th percentile of every Eureka API endpoint's latency over 5 minutes.",
                    quantiles(&[0.99], HTTP, "endpoint", "{{endpoint}}"),
                ),
                panel(
                    Series,
                    "Server errors",
                    "percentunit",
                    8,
                    "The share of Eureka API answers with a 5xx status, per replica, over 5 minutes.",
                    vec![q(
                        &format!(
                            "(sum by (instance) (rate({errors}{WINDOW})) or sum by (instance) \
                             (rate({requests}{WINDOW})) * 0) / sum by (instance) (rate({requests}{WINDOW}))"
                        ),
                        "{{instance}}",
                    )],
                ),
                panel(
                    Series,
                    "Load shedding",
                    "ops",
                    8,
                    "Requests and connections refused under load per second, by listener and reason. \
                     Clients retry another server; a lasting line means this replica is short of \
                     capacity.",
                    vec![q(
                        "sum by (instance, listener, reason) (rate(eureka_http_shed_total[5m]))",
                        "{{listener}} {{reason}} · {{instance}}",
                    )],
                ),
                panel(
                    Series,
                    "Open connections",
                    "short",
                    8,
                    "Connections open on each listener.",
                    vec![q(
                        "sum by (instance, listener) (eureka_http_open_connections)",
                        "{{listener}} · {{instance}}",
                    )],
                ),
            ],
        },
        Row {
            title: "Replication",
            panels: vec![
                panel(
                    Series,
                    "Queued tasks per peer",
                    "short",
                    8,
                    "Replication tasks waiting to be sent from each replica to each peer. A queue that \
                     keeps growing means the peer is slow or unreachable.",
                    vec![q(
                        "sum by (instance, peer) (eureka_replication_queued)",
                        "{{instance}} → {{peer}}",
                    )],
                ),
                panel(
                    Series,
                    "Tasks delivered per peer",
                    "ops",
                    8,
                    "Replication tasks delivered per second, from each replica to each peer.",
                    vec![q(
                        "sum by (instance, peer) (rate(eureka_replication_sent_items_total[5m]))",
                        "{{instance}} → {{peer}}",
                    )],
                ),
                panel(
                    Stat(UP_DOWN),
                    "Peer reachable",
                    "short",
                    8,
                    "Whether each replica currently reaches each of its peers.",
                    vec![q(
                        "min by (instance, peer, kind) (eureka_replication_peer_up)",
                        "{{instance}} → {{peer}} ({{kind}})",
                    )],
                ),
                panel(
                    Series,
                    "Failed batches",
                    "ops",
                    8,
                    "Replication batches that failed per second, by peer and class of failure. Failed \
                     batches are retried.",
                    vec![q(
                        "sum by (instance, peer, class) (rate(eureka_replication_failures_total[5m]))",
                        "{{instance}} → {{peer}}: {{class}}",
                    )],
                ),
                panel(
                    Series,
                    "Dropped tasks",
                    "ops",
                    8,
                    "Replication tasks given up per second, by peer and reason. A dropped task is a \
                     change the peer misses until the leader's registry comparison repairs it.",
                    vec![q(
                        "sum by (instance, peer, reason) (rate(eureka_replication_dropped_total[5m]))",
                        "{{instance}} → {{peer}}: {{reason}}",
                    )],
                ),
                panel(
                    Series,
                    "Repairs (per 5 minutes)",
                    "short",
                    8,
                    "Entries the leader's comparison of the registries repaired in the last 5 minutes, by \
                     action. Repairs after an outage are expected; a steady flow means replication \
                     loses changes.",
                    vec![q(
                        "sum by (instance, action) (increase(eureka_replication_repairs_total[5m]))",
                        "{{action}} · {{instance}}",
                    )],
                ),
            ],
        },
        Row {
            title: "Links",
            panels: vec![
                panel(
                    Stat(UP_DOWN),
                    "Link answers",
                    "short",
                    8,
                    "Whether each replica's last poll over each link to another cluster succeeded. \
                     Every replica pulls every link itself.",
                    vec![q("min by (instance, link) (eureka_link_up)", "{{instance}} → {{link}}")],
                ),
                panel(
                    Series,
                    "Since the last answer",
                    "s",
                    8,
                    "Seconds since each link last answered each replica: past the link's \
                     staleAfterSeconds it is a /readyz warning, past withdrawAfterSeconds its \
                     instances are withdrawn by its onWithdraw policy.",
                    vec![q(
                        "max by (instance, link) (eureka_link_last_success_age_seconds)",
                        "{{instance}} → {{link}}",
                    )],
                ),
                panel(
                    Series,
                    "Imported instances",
                    "short",
                    8,
                    "Instances in each replica's copy of each link, and of those hidden because a \
                     local instance has the same id.",
                    vec![
                        q("max by (link) (eureka_link_instances)", "{{link}} copy"),
                        q(
                            "max by (link) (eureka_link_hidden_instances)",
                            "{{link}} hidden by local",
                        ),
                    ],
                ),
                panel(
                    Series,
                    "Failed polls",
                    "ops",
                    8,
                    "Polls that failed per second, by link and class (unreachable, timeout, \
                     unauthorized, loop, http, invalid, over_limit). The copy is kept meanwhile.",
                    vec![q(
                        "sum by (link, class) (rate(eureka_link_failures_total[5m]))",
                        "{{link}}: {{class}}",
                    )],
                ),
                panel(
                    Stat(WITHDRAWN),
                    "Withdrawn",
                    "short",
                    8,
                    "Whether a link's instances are withdrawn on a replica after its silence.",
                    vec![q(
                        "max by (instance, link) (eureka_link_withdrawn)",
                        "{{instance}} → {{link}}",
                    )],
                ),
                panel(
                    Series,
                    "Polls",
                    "ops",
                    8,
                    "Successful polls per second by kind: changes since the copy's version, or the \
                     whole export (at start, after the source restarted, or after a hash-code \
                     mismatch).",
                    vec![q(
                        "sum by (link, kind) (rate(eureka_link_polls_total[5m]))",
                        "{{link}}: {{kind}}",
                    )],
                ),
            ],
        },
        Row {
            title: "Kubernetes",
            panels: vec![
                panel(
                    Stat(STANDBY_LEADER),
                    "Leader",
                    "short",
                    8,
                    "Which replica holds the Lease (and so runs the controller and evicts expired \
                     leases).",
                    vec![q("max by (instance) (eureka_leader)", "{{instance}}")],
                )
                .height(5),
                panel(
                    Stat(READY),
                    "Ready",
                    "short",
                    8,
                    "Whether each replica answers its readiness probe.",
                    vec![q("min by (instance) (eureka_ready)", "{{instance}}")],
                )
                .height(5),
                panel(
                    Stat(FAILING),
                    "Watches",
                    "short",
                    8,
                    "Whether each of a replica's Kubernetes watches is failing (it retries with \
                     backoff; meanwhile what it watches goes stale).",
                    vec![q(
                        "max by (instance, watch) (eureka_watch_failing)",
                        "{{watch}} · {{instance}}",
                    )],
                )
                .height(5),
                panel(
                    Series,
                    "Reconciles",
                    "ops",
                    8,
                    "EurekaApp reconciles per second.",
                    vec![q(
                        "sum by (instance) (rate(eureka_controller_reconciles_total[5m]))",
                        "{{instance}}",
                    )],
                ),
                panel(
                    Series,
                    "Kubernetes API errors",
                    "ops",
                    8,
                    "Failed writes to, and failed watches of, the Kubernetes API per second. Both are \
                     retried with backoff.",
                    vec![
                        q(
                            "sum by (instance) (rate(eureka_controller_write_errors_total[5m]))",
                            "writes · {{instance}}",
                        ),
                        q(
                            "sum by (instance) (rate(eureka_controller_watch_errors_total[5m]))",
                            "watches · {{instance}}",
                        ),
                    ],
                ),
                panel(
                    Series,
                    "Reconcile duration p99",
                    "s",
                    8,
                    "The 99th percentile of the time one EurekaApp reconcile takes, over 5 minutes.",
                    quantiles(
                        &[0.99],
                        "eureka_controller_reconcile_duration_seconds_bucket",
                        "instance",
                        "{{instance}}",
                    ),
                ),
                panel(
                    Series,
                    "Pod Ready → UP (p50, p99)",
                    "s",
                    12,
                    "From a pod turning Ready to its instance being UP in the registry: how long \
                     clients wait to be sent to a new pod.",
                    quantiles(&[0.5, 0.99], "eureka_controller_pod_ready_to_up_seconds_bucket", "", ""),
                ),
                panel(
                    Series,
                    "EurekaApp status writes",
                    "ops",
                    12,
                    "Patches of EurekaApp status per second.",
                    vec![q(
                        "sum by (instance) (rate(eureka_controller_status_writes_total[5m]))",
                        "{{instance}}",
                    )],
                ),
            ],
        },
        Row {
            title: "EurekaApps",
            panels: vec![
                panel(
                    Series,
                    "Instances per EurekaApp",
                    "short",
                    12,
                    "Each EurekaApp's instances in the registry, by status. Every replica reports the \
                     same figures, so the highest is shown.",
                    vec![q(
                        "max without (instance, pod) (eureka_eurekaapp_instances)",
                        "{{eurekaapp_namespace}}/{{eurekaapp}} {{status}}",
                    )],
                ),
                panel(
                    Table(&[
                        ("eurekaapp_namespace", "Namespace"),
                        ("eurekaapp", "EurekaApp"),
                        ("type", "Condition"),
                    ]),
                    "Conditions holding",
                    "short",
                    12,
                    "Each EurekaApp's status conditions that are true now (the series of a condition's \
                     current status is 1).",
                    vec![q(
                        r#"max by (eurekaapp_namespace, eurekaapp, type) (eureka_eurekaapp_condition{status="true"}) == 1"#,
                        "",
                    )],
                ),
                panel(
                    Series,
                    "Pods awaiting registration",
                    "short",
                    12,
                    "Selected pods of an adopting EurekaApp whose own Eureka client has not registered \
                     yet.",
                    vec![q(
                        "max without (instance, pod) (eureka_eurekaapp_awaiting_registration)",
                        "{{eurekaapp_namespace}}/{{eurekaapp}}",
                    )],
                ),
                panel(
                    Series,
                    "Selected pods",
                    "short",
                    12,
                    "Pods each EurekaApp's selector matches.",
                    vec![q(
                        "max without (instance, pod) (eureka_eurekaapp_selected_pods)",
                        "{{eurekaapp_namespace}}/{{eurekaapp}}",
                    )],
                ),
            ],
        },
        Row {
            title: "Process",
            panels: vec![
                panel(
                    Series,
                    "CPU",
                    "percentunit",
                    8,
                    "CPU time used per second (100% is one core).",
                    vec![q(
                        "sum by (instance) (rate(process_cpu_seconds_total[5m]))",
                        "{{instance}}",
                    )],
                ),
                panel(
                    Series,
                    "Resident memory",
                    "bytes",
                    8,
                    "Memory the process holds in RAM.",
                    vec![q("sum by (instance) (process_resident_memory_bytes)", "{{instance}}")],
                ),
                panel(
                    LogSeries,
                    "File descriptors",
                    "short",
                    8,
                    "Open file descriptors (solid) against the process's limit (dashed), on a \
                     logarithmic axis. Each client connection holds one.",
                    vec![
                        q("sum by (instance) (process_open_fds)", "open · {{instance}}"),
                        limit("sum by (instance) (process_max_fds)", "max · {{instance}}"),
                    ],
                ),
                panel(
                    Series,
                    "Threads",
                    "short",
                    12,
                    "Operating-system threads of the process.",
                    vec![q("sum by (instance) (process_threads)", "{{instance}}")],
                ),
                panel(
                    Table(&[("version", "Version"), ("Value", "Replicas")]),
                    "Versions",
                    "short",
                    12,
                    "The versions the selected replicas run, and how many run each.",
                    vec![q("count by (version) (eureka_build_info)", "")],
                ),
            ],
        },
    ]
}

/// `expr` with the dashboard's matchers on every series it reads: each `eureka_*` or `process_*`
/// name outside a string gets `{job=~"$job", instance=~"$instance"}`, before matchers of its own.
fn filtered(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len() + 64);
    let mut chars = expr.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c == '"' {
            out.push(c);
            let mut escaped = false;
            for (_, c) in chars.by_ref() {
                out.push(c);
                match c {
                    '\\' if !escaped => escaped = true,
                    '"' if !escaped => break,
                    _ => escaped = false,
                }
            }
        } else if c.is_ascii_alphabetic() || c == '_' {
            let mut end = start + c.len_utf8();
            while let Some(&(i, c)) = chars.peek() {
                if !(c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                    break;
                }
                end = i + c.len_utf8();
                chars.next();
            }
            let name = &expr[start..end];
            out.push_str(name);
            if name.starts_with("eureka_") || name.starts_with("process_") {
                if chars.peek().is_some_and(|&(_, c)| c == '{') {
                    chars.next();
                    out.push('{');
                    out.push_str(SELECTOR);
                    if chars.peek().is_some_and(|&(_, c)| c != '}') {
                        out.push_str(", ");
                    }
                } else {
                    out.push('{');
                    out.push_str(SELECTOR);
                    out.push('}');
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Every panel query of the dashboard, in panel order, with `$job` and `$instance` in place.
pub fn queries() -> Vec<String> {
    rows()
        .iter()
        .flat_map(|row| &row.panels)
        .flat_map(|panel| &panel.targets)
        .map(|target| filtered(&target.expr))
        .collect()
}

fn datasource() -> Value {
    json!({"type": "prometheus", "uid": "${datasource}"})
}

fn thresholds() -> Value {
    json!({"mode": "absolute", "steps": [{"color": "green", "value": null}]})
}

/// The letters Grafana names a panel's queries with.
fn ref_id(i: usize) -> String {
    char::from(b'A' + u8::try_from(i).expect("too many queries in a panel")).to_string()
}

fn targets(panel: &Panel) -> Value {
    let table = matches!(panel.kind, Kind::Table(_));
    panel
        .targets
        .iter()
        .enumerate()
        .map(|(i, target)| {
            json!({
                "datasource": datasource(),
                "editorMode": "code",
                "expr": filtered(&target.expr),
                "format": if table { "table" } else { "time_series" },
                "instant": table,
                "legendFormat": target.legend,
                "range": !table,
                "refId": ref_id(i),
            })
        })
        .collect()
}

/// What draws a panel: its type, options and field configuration.
fn visualization(panel: &Panel) -> (&'static str, Value, Value, Value) {
    match &panel.kind {
        Kind::Series | Kind::LogSeries => {
            let log = matches!(panel.kind, Kind::LogSeries);
            let mut custom = json!({
                "axisBorderShow": false,
                "axisCenteredZero": false,
                "axisColorMode": "text",
                "axisLabel": "",
                "axisPlacement": "auto",
                "barAlignment": 0,
                "drawStyle": "line",
                "fillOpacity": 10,
                "gradientMode": "none",
                "hideFrom": {"legend": false, "tooltip": false, "viz": false},
                "insertNulls": false,
                "lineInterpolation": "linear",
                "lineWidth": 1,
                "pointSize": 5,
                "scaleDistribution": if log { json!({"type": "log", "log": 10}) } else { json!({"type": "linear"}) },
                "showPoints": "never",
                "spanNulls": false,
                "stacking": {"group": "A", "mode": "none"},
                "thresholdsStyle": {"mode": "off"},
            });
            if !log {
                custom["axisSoftMin"] = json!(0);
            }
            let overrides: Vec<Value> = panel
                .targets
                .iter()
                .enumerate()
                .filter(|(_, target)| target.dashed)
                .map(|(i, _)| {
                    json!({
                        "matcher": {"id": "byFrameRefID", "options": ref_id(i)},
                        "properties": [
                            {"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}},
                            {"id": "custom.fillOpacity", "value": 0},
                        ],
                    })
                })
                .collect();
            (
                "timeseries",
                json!({
                    "legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": true},
                    "tooltip": {"mode": "multi", "sort": "desc"},
                }),
                json!({
                    "defaults": {
                        "color": {"mode": "palette-classic"},
                        "custom": custom,
                        "mappings": [],
                        "thresholds": thresholds(),
                        "unit": panel.unit,
                    },
                    "overrides": overrides,
                }),
                json!([]),
            )
        }
        Kind::Stat(states) => {
            let options: serde_json::Map<String, Value> = states
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    (
                        s.value.to_string(),
                        json!({"color": s.color, "index": i, "text": s.text}),
                    )
                })
                .collect();
            (
                "stat",
                json!({
                    "colorMode": "background",
                    "graphMode": "none",
                    "justifyMode": "auto",
                    "orientation": "auto",
                    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": false},
                    "showPercentChange": false,
                    "textMode": "value_and_name",
                    "wideLayout": true,
                }),
                json!({
                    "defaults": {
                        "color": {"mode": "thresholds"},
                        "mappings": [{"options": options, "type": "value"}],
                        "thresholds": {"mode": "absolute", "steps": [{"color": "text", "value": null}]},
                        "unit": panel.unit,
                    },
                    "overrides": [],
                }),
                json!([]),
            )
        }
        Kind::Table(columns) => {
            let mut exclude = serde_json::Map::new();
            exclude.insert("Time".into(), json!(true));
            if !columns.iter().any(|(name, _)| *name == "Value") {
                exclude.insert("Value".into(), json!(true));
            }
            let index: serde_json::Map<String, Value> = columns
                .iter()
                .enumerate()
                .map(|(i, (name, _))| (name.to_string(), json!(i)))
                .collect();
            let rename: serde_json::Map<String, Value> = columns
                .iter()
                .map(|(name, header)| (name.to_string(), json!(header)))
                .collect();
            (
                "table",
                json!({
                    "cellHeight": "sm",
                    "footer": {"countRows": false, "fields": "", "reducer": ["sum"], "show": false},
                    "showHeader": true,
                }),
                json!({
                    "defaults": {
                        "custom": {"align": "auto", "cellOptions": {"type": "auto"}, "inspect": false},
                        "mappings": [],
                        "thresholds": thresholds(),
                        "unit": panel.unit,
                    },
                    "overrides": [],
                }),
                json!([{
                    "id": "organize",
                    "options": {"excludeByName": exclude, "indexByName": index, "renameByName": rename},
                }]),
            )
        }
    }
}

/// The dashboard's panels: each row's header, then its panels left to right, a new line of the
/// grid whenever the next panel does not fit.
fn panels() -> Vec<Value> {
    let mut out = Vec::new();
    let (mut id, mut y) = (0, 0);
    for row in rows() {
        id += 1;
        out.push(json!({
            "collapsed": false,
            "gridPos": {"h": 1, "w": COLUMNS, "x": 0, "y": y},
            "id": id,
            "panels": [],
            "title": row.title,
            "type": "row",
        }));
        y += 1;
        let (mut x, mut line_height) = (0, 0);
        for panel in &row.panels {
            if x + panel.width > COLUMNS {
                (x, y, line_height) = (0, y + line_height, 0);
            }
            id += 1;
            let (kind, options, field_config, transformations) = visualization(panel);
            out.push(json!({
                "datasource": datasource(),
                "description": panel.description,
                "fieldConfig": field_config,
                "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
                "id": id,
                "options": options,
                "targets": targets(panel),
                "title": panel.title,
                "transformations": transformations,
                "type": kind,
            }));
            x += panel.width;
            line_height = line_height.max(panel.height);
        }
        y += line_height;
    }
    out
}

fn variables() -> Value {
    let query = |expr: &str| {
        json!({
            "qryType": 1,
            "query": expr,
            "refId": "PrometheusVariableQueryEditor-VariableQuery",
        })
    };
    let jobs = "label_values(eureka_build_info, job)";
    let instances = r#"label_values(eureka_build_info{job=~"$job"}, instance)"#;
    json!([
        {
            "current": {},
            "hide": 0,
            "includeAll": false,
            "label": "Data source",
            "multi": false,
            "name": "datasource",
            "options": [],
            "query": "prometheus",
            "refresh": 1,
            "regex": "",
            "skipUrlSync": false,
            "type": "datasource",
        },
        {
            "current": {},
            "datasource": datasource(),
            "definition": jobs,
            "hide": 0,
            "includeAll": false,
            "label": "Job",
            "multi": false,
            "name": "job",
            "options": [],
            "query": query(jobs),
            "refresh": 2,
            "regex": "",
            "skipUrlSync": false,
            "sort": 1,
            "type": "query",
        },
        {
            "allValue": ".*",
            "current": {"selected": true, "text": ["All"], "value": ["$__all"]},
            "datasource": datasource(),
            "definition": instances,
            "hide": 0,
            "includeAll": true,
            "label": "Instance",
            "multi": true,
            "name": "instance",
            "options": [],
            "query": query(instances),
            "refresh": 2,
            "regex": "",
            "skipUrlSync": false,
            "sort": 1,
            "type": "query",
        },
    ])
}

/// The dashboard as Grafana imports it (pretty JSON, ending with a newline).
pub fn render() -> String {
    let dashboard = json!({
        "annotations": {"list": [{
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": true,
            "hide": true,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }]},
        "description": "eureka-operator: the registry, its clients, replication between replicas, the \
            Kubernetes controller and the process. Generated by `cargo run --bin docgen -- --write` from \
            src/bin/docgen/dashboard.rs; do not edit.",
        "editable": true,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": null,
        "links": [],
        "panels": panels(),
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": ["eureka", "eureka-operator"],
        "templating": {"list": variables()},
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": "eureka-operator",
        "uid": "eureka-operator",
        "version": 1,
        "weekStart": "",
    });
    let mut out = serde_json::to_string_pretty(&dashboard).expect("a JSON value serializes");
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed dashboard is what `render` produces now, so a panel cannot change without
    /// the chart's copy.
    #[test]
    fn the_charts_dashboard_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(CHART_PATH);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        let rendered = render();
        if let Some((line, committed, rendered)) = crate::pages::drift(&rendered, &committed) {
            panic!(
                "{CHART_PATH} is not what src/bin/docgen/dashboard.rs renders (first difference at line {line}):\n  \
                 committed: {committed:?}\n  rendered:  {rendered:?}\nrun `cargo run --bin docgen -- --write` and commit the result",
            );
        }
    }

    /// The metrics the dashboard may read: those the operator exports.
    const METRICS: &[&str] = &[
        "eureka_applications",
        "eureka_build_info",
        "eureka_cancellations_total",
        "eureka_controller_pod_ready_to_up_seconds_bucket",
        "eureka_controller_reconcile_duration_seconds_bucket",
        "eureka_controller_reconciles_total",
        "eureka_controller_status_writes_total",
        "eureka_controller_watch_errors_total",
        "eureka_controller_write_errors_total",
        "eureka_eurekaapp_awaiting_registration",
        "eureka_eurekaapp_condition",
        "eureka_eurekaapp_instances",
        "eureka_eurekaapp_selected_pods",
        "eureka_evictions_total",
        "eureka_expired_leases",
        "eureka_http_open_connections",
        "eureka_http_request_duration_seconds_bucket",
        "eureka_http_shed_total",
        "eureka_instances",
        "eureka_instances_by_status",
        "eureka_leader",
        "eureka_limit_refusals_total",
        "eureka_link_failures_total",
        "eureka_link_hidden_instances",
        "eureka_link_instances",
        "eureka_link_last_success_age_seconds",
        "eureka_link_polls_total",
        "eureka_link_up",
        "eureka_link_withdrawn",
        "eureka_ready",
        "eureka_registrations_total",
        "eureka_renewals_per_minute",
        "eureka_renewals_per_minute_threshold",
        "eureka_replication_dropped_total",
        "eureka_replication_failures_total",
        "eureka_replication_peer_up",
        "eureka_replication_queued",
        "eureka_replication_repairs_total",
        "eureka_replication_sent_items_total",
        "eureka_self_preservation_active",
        "eureka_watch_failing",
        "process_cpu_seconds_total",
        "process_max_fds",
        "process_open_fds",
        "process_resident_memory_bytes",
        "process_threads",
    ];

    /// The metric names of a query outside strings: where each starts, the name, what follows.
    fn series(expr: &str) -> Vec<(usize, &str, &str)> {
        let mut found = Vec::new();
        let mut in_string = false;
        let bytes = expr.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i];
            if c == b'"' && (i == 0 || bytes[i - 1] != b'\\') {
                in_string = !in_string;
            } else if !in_string
                && (c == b'e' || c == b'p')
                && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'))
            {
                let end = expr[i..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                    .map_or(expr.len(), |n| i + n);
                let name = &expr[i..end];
                if name.starts_with("eureka_") || name.starts_with("process_") {
                    found.push((i, name, &expr[end..]));
                }
                i = end;
                continue;
            }
            i += 1;
        }
        found
    }

    /// Every query reads only exported metrics, each through the `job` and `instance` variables,
    /// and counters and histograms only through `rate()` or `increase()` over 5 minutes.
    #[test]
    fn every_query_filters_by_job_and_instance_and_rates_counters() {
        let queries = queries();
        assert!(queries.len() >= 40, "only {} queries", queries.len());
        for query in &queries {
            assert!(!query.contains('\n'), "{query:?} spans lines");
            let found = series(query);
            assert!(!found.is_empty(), "{query} reads no metric");
            for (start, name, rest) in found {
                assert!(METRICS.contains(&name), "{query} reads {name}, which is not exported");
                assert!(
                    rest.starts_with(&format!("{{{SELECTOR}")),
                    "{query}: {name} lacks the job and instance matchers"
                );
                let counter = name.ends_with("_total") || name.ends_with("_bucket");
                if counter {
                    let after = &rest[rest.find('}').expect("matchers close") + 1..];
                    assert!(after.starts_with(WINDOW), "{query}: {name} is not read over {WINDOW}");
                    let before = &query[..start];
                    assert!(
                        before.ends_with("rate(") || before.ends_with("increase("),
                        "{query}: {name} is read without rate() or increase()"
                    );
                }
            }
        }
    }

    #[test]
    fn filtered_merges_the_matchers_with_a_querys_own() {
        assert_eq!(
            filtered(r#"sum(rate(eureka_x_total{a="eureka_y", b="\"process_z"}[5m])) / process_w"#),
            r#"sum(rate(eureka_x_total{job=~"$job", instance=~"$instance", a="eureka_y", b="\"process_z"}[5m])) / process_w{job=~"$job", instance=~"$instance"}"#
        );
        assert_eq!(
            filtered("max without (instance, pod) (eureka_eurekaapp_instances{})"),
            r#"max without (instance, pod) (eureka_eurekaapp_instances{job=~"$job", instance=~"$instance"})"#
        );
    }

    /// Each line of panels fills the 24 columns with panels of one height, ids are unique, and
    /// every panel has a title, a description, a unit and queries with legends.
    #[test]
    fn the_panels_tile_the_grid() {
        let dashboard: Value = serde_json::from_str(&render()).unwrap();
        assert_eq!(dashboard["schemaVersion"], 39);
        assert_eq!(dashboard["uid"], "eureka-operator");
        let panels = dashboard["panels"].as_array().unwrap();
        let mut ids: Vec<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), panels.len(), "panel ids repeat");
        let mut lines: std::collections::BTreeMap<u64, Vec<&Value>> = Default::default();
        for p in panels {
            lines.entry(p["gridPos"]["y"].as_u64().unwrap()).or_default().push(p);
        }
        let mut next_y = 0;
        for (y, line) in &lines {
            assert_eq!(*y, next_y, "a gap or an overlap above line {y}");
            let width: u64 = line.iter().map(|p| p["gridPos"]["w"].as_u64().unwrap()).sum();
            assert_eq!(width, u64::from(COLUMNS), "the line at y={y} is {width} columns wide");
            let mut x = 0;
            for p in line {
                assert_eq!(p["gridPos"]["x"].as_u64().unwrap(), x, "{} is misplaced", p["title"]);
                x += p["gridPos"]["w"].as_u64().unwrap();
            }
            let heights: Vec<u64> = line.iter().map(|p| p["gridPos"]["h"].as_u64().unwrap()).collect();
            assert!(heights.windows(2).all(|h| h[0] == h[1]), "uneven line at y={y}");
            next_y = y + heights[0];
            for p in line.iter().filter(|p| p["type"] != "row") {
                assert!(
                    !p["description"].as_str().unwrap().is_empty(),
                    "{} has no description",
                    p["title"]
                );
                assert!(
                    p["fieldConfig"]["defaults"]["unit"].is_string(),
                    "{} has no unit",
                    p["title"]
                );
                for t in p["targets"].as_array().unwrap() {
                    assert!(
                        p["type"] == "table" || !t["legendFormat"].as_str().unwrap().is_empty(),
                        "a query of {} has no legend",
                        p["title"]
                    );
                }
            }
        }
    }
}
