//! The readiness gate (EurekaApp `readinessGate`), with kube-controller-manager rolling a real
//! Deployment on kwok's fake nodes (kwok plays the kubelet: a pod with readiness gates is Ready
//! only once its gate condition is True). The leader opens a pod's gate only once every ready
//! replica holds its instance UP, plus the configured delay; a rollout waits for that. Replicas
//! are found through static peer URLs, or through the EndpointSlices of their headless Service,
//! where a replica whose readiness probe fails drops out of the ready set.

use std::{
    collections::HashMap,
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;

use crate::{
    common::{
        cluster::Cluster,
        operator::{Operator, eureka_app, host_ip, instances, namespace, replica_slice},
        process::{free_port, wait_for},
    },
    faults::{leader_of, two_replicas},
    lifecycle::{apply, lifecycle_cluster, rolled_out},
};

const GATE: &str = "eureka-operator.dev/registered";
/// The gate's `delaySeconds`: a pod is Ready no sooner than this after every replica holds it UP
/// (so after its containers are ready).
const DELAY_S: i64 = 2;
const V1: &str = "example/web:1";
const V2: &str = "example/web:2";

fn gated_deployment(ns: &str, image: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {ns}}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: web}}}}
  strategy: {{type: RollingUpdate, rollingUpdate: {{maxSurge: 1, maxUnavailable: 0}}}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      terminationGracePeriodSeconds: 2
      readinessGates: [{{conditionType: {GATE}}}]
      containers:
      - name: app
        image: {image}
        ports: [{{name: http, containerPort: 8080}}]
"
    )
}

fn image_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.containers.first()?.image.as_deref()
}

/// The second (whole seconds: what a condition's `lastTransitionTime` has) at which the pod's
/// condition `type_` became True, if it is True.
fn true_since(p: &Pod, type_: &str) -> Option<i64> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0.as_second())
}

fn is_true(p: &Pod, type_: &str) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

async fn web_pods(pods: &Api<Pod>, image: &str) -> Vec<Pod> {
    let list = pods.list(&ListParams::default().labels("app=web")).await.unwrap();
    list.items.into_iter().filter(|p| image_of(p) == Some(image)).collect()
}

/// Seconds between the `ContainersReady` and `Ready` conditions of each pod running `image`.
/// Both are whole seconds, and the gate opens at least [`DELAY_S`] after the containers were
/// ready, so each wait is at least [`DELAY_S`] exactly (a truncated `t + d` is at least the
/// truncated `t` plus `d`).
async fn gate_waits(pods: &Api<Pod>, image: &str) -> HashMap<String, i64> {
    web_pods(pods, image)
        .await
        .iter()
        .filter_map(|p| {
            Some((
                p.metadata.name.clone()?,
                true_since(p, "Ready")? - true_since(p, "ContainersReady")?,
            ))
        })
        .collect()
}

fn assert_waits(waits: &HashMap<String, i64>, what: &str) {
    assert_eq!(waits.len(), 3, "{what}: {waits:?}");
    assert!(
        waits.values().all(|w| *w >= DELAY_S),
        "{what}: pods became Ready sooner than the gate's delaySeconds ({DELAY_S} s) after their containers: \
         {waits:?} s"
    );
}

/// Applies the gated EurekaApp `web` and its Deployment, waits for the first rollout, and checks
/// that every replica holds the 3 instances UP and that each pod waited the gate's delay.
async fn first_rollout(cluster: &Cluster, ns: &str, replicas: &[Operator]) -> HashMap<String, i64> {
    let client = cluster.admin().await;
    eureka_app(
        cluster,
        ns,
        "web",
        &format!(
            "  selector: {{matchLabels: {{app: web}}}}\n  port: http\n  drainSeconds: 1\n  readinessGate: {{conditionType: {GATE}, delaySeconds: {DELAY_S}}}\n"
        ),
    );
    apply(cluster, &gated_deployment(ns, V1));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    wait_for(
        "the gated rollout to complete",
        Duration::from_secs(90),
        Duration::from_millis(200),
        || async {
            let d = deployments.get("web").await.ok()?;
            rolled_out(&d, 3).then_some(())
        },
    )
    .await;
    for r in replicas {
        let ups = instances(&r.server, "WEB").await;
        assert_eq!(ups.iter().filter(|(_, s)| s == "UP").count(), 3, "{ups:?}");
    }
    let waits = gate_waits(&Api::namespaced(client, ns), V1).await;
    assert_waits(&waits, "first rollout");
    waits
}

/// What [`roll_while_frozen`] saw.
struct Held {
    /// The new pod whose containers were ready and whose instance was UP on the leader.
    pod: String,
    /// From the rollout's start to that pod being seen so.
    seen_after: Duration,
    /// How long the rollout was watched holding.
    held: Duration,
}

/// Rolls `web` to [`V2`] while a replica is frozen (the caller froze it) and watches the rollout
/// hold, for at least `at_least` and for at least [`DELAY_S`] + 3 s after a new pod was seen with
/// its containers ready and its instance UP on `leader` (so the gate, not a slow rollout, is what
/// holds it): all the while no old pod goes and no new pod is Ready.
async fn roll_while_frozen(cluster: &Cluster, ns: &str, leader: &Operator, at_least: Duration) -> Held {
    let client = cluster.admin().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let roll = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": V2}]}}}});
    deployments
        .patch("web", &PatchParams::default(), &Patch::Strategic(&roll))
        .await
        .unwrap();
    let started = Instant::now();
    let mut waiting: Option<(String, Instant)> = None;
    let after_seen = Duration::from_secs(DELAY_S as u64 + 3);
    loop {
        let held_long_enough = waiting.as_ref().is_some_and(|(_, at)| at.elapsed() >= after_seen);
        if started.elapsed() >= at_least && held_long_enough {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no new pod had its containers ready and its instance UP on the leader 60 s into the rollout: \
             the rollout never reached the gate, so its holding proves nothing ({:?})",
            web_pods(&pods, V2)
                .await
                .iter()
                .map(|p| (p.metadata.name.clone(), p.status.as_ref().map(|s| s.conditions.clone())))
                .collect::<Vec<_>>()
        );
        let d = deployments.get("web").await.unwrap();
        let status = d.status.unwrap_or_default();
        assert!(
            status.available_replicas.unwrap_or(0) >= 3,
            "an old pod went before a new one was visible everywhere: {status:?}"
        );
        let new = web_pods(&pods, V2).await;
        let ready: Vec<_> = new
            .iter()
            .filter(|p| is_true(p, "Ready"))
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        assert!(
            ready.is_empty(),
            "a new pod became Ready while a replica could not confirm it: {ready:?}"
        );
        if waiting.is_none() {
            let up: Vec<String> = instances(&leader.server, "WEB")
                .await
                .into_iter()
                .filter(|(_, s)| s == "UP")
                .map(|(id, _)| id)
                .collect();
            waiting = new
                .iter()
                .filter(|p| is_true(p, "ContainersReady"))
                .filter_map(|p| p.metadata.name.clone())
                .find(|name| up.iter().any(|id| id.starts_with(&format!("{name}.{ns}:"))))
                .map(|name| (name, Instant::now()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (pod, seen) = waiting.expect("seen");
    Held {
        pod,
        seen_after: seen - started,
        held: started.elapsed(),
    }
}

async fn wait_rolled_out(cluster: &Cluster, ns: &str, what: &str) {
    let deployments: Api<Deployment> = Api::namespaced(cluster.admin().await, ns);
    wait_for(what, Duration::from_secs(120), Duration::from_millis(200), || async {
        let d = deployments.get("web").await.ok()?;
        rolled_out(&d, 3).then_some(())
    })
    .await;
}

/// Replicas that are each other's static peers: the gate delays each pod by its `delaySeconds`,
/// and with one replica frozen a rollout holds (a new pod's containers are ready and the leader
/// holds it UP, but it is not Ready, and no old pod goes) until the replica is back.
///
/// Killed by the `gate-opens-early` mutant (tests/mutants).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_waits_until_every_replica_has_the_instance() {
    let Some(cluster) = lifecycle_cluster() else { return };
    let client = cluster.admin().await;
    let ns = "gate";
    namespace(&client, ns).await;
    let replicas = two_replicas(cluster, ns, "gate", 201, &[]).await;
    let waits = first_rollout(cluster, ns, &replicas).await;

    // Freeze the follower: the leader can no longer see the new instances everywhere, so new pods
    // stay not Ready and the rollout does not move.
    let leader = leader_of(&replicas).await;
    let follower = &replicas[1 - leader];
    follower.server.proc.freeze();
    let held = roll_while_frozen(cluster, ns, &replicas[leader], Duration::from_secs(8)).await;
    follower.server.proc.resume();
    let resumed = Instant::now();
    wait_rolled_out(cluster, ns, "the rollout to complete after the replica is back").await;
    let resumed_to_done = resumed.elapsed();
    let new_waits = gate_waits(&Api::namespaced(client, ns), V2).await;
    assert_waits(&new_waits, "rollout after the replica was back");
    eprintln!(
        "FIGURES readiness_gate: waits {waits:?} s; the rollout held {:?} while a replica was frozen, then completed {resumed_to_done:?} after it resumed",
        held.held
    );
    eprintln!(
        "FIGURES readiness_gate: new pod {} had its containers ready and its instance UP on the leader {:?} into the rollout, and was held; waits after the replica was back {new_waits:?} s",
        held.pod, held.seen_after
    );
}

/// Replicas found through the EndpointSlices of their headless Service (`--peer-service`): the
/// gate delays each pod by its `delaySeconds`; with one replica frozen a rollout holds while its
/// endpoint is still serving, and once the endpoint is no longer serving (its readiness probe
/// failed) the frozen replica is out of the ready set and the rollout completes without it, each
/// gate still opening only after the delay.
///
/// The test plays the EndpointSlice controller (whose slices are of Services with selectors and
/// pods with probes; the replicas here are processes on this machine): it writes one slice per
/// replica as the controller does for the chart's headless Service (`ready` always, `serving` the
/// readiness), and sets the frozen replica's `serving` to false as the controller does once the
/// kubelet's readiness probe of a frozen process has failed.
///
/// Killed by the `gate-opens-early` mutant (tests/mutants).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_drops_out_of_the_endpointslices_no_longer_holds_a_rollout() {
    let Some(cluster) = lifecycle_cluster() else { return };
    let client = cluster.admin().await;
    let ns = "gate-eps";
    namespace(&client, ns).await;
    let service = "gate-eps-peers";
    let ip = host_ip();
    let ports = [(free_port(ip), free_port(ip)), (free_port(ip), free_port(ip))];
    let names = ["gate-eps-0", "gate-eps-1"];
    for (name, (port, _)) in names.iter().zip(&ports) {
        replica_slice(cluster, service, name, ip, *port, true);
    }
    // The slices list both as serving before either runs: one start-up sync attempt is enough.
    let extra = [
        "--peer-service",
        service,
        "--replication-max-batching-delay-ms",
        "20",
        "--registry-sync-retries",
        "1",
    ];
    let mut replicas = Vec::new();
    for (name, ports) in names.iter().zip(ports) {
        replicas.push(Operator::start_on(cluster, ip, ports, ns, "gate-eps", name, &extra).await);
    }
    let waits = first_rollout(cluster, ns, &replicas).await;

    let leader = leader_of(&replicas).await;
    let follower = 1 - leader;
    replicas[follower].server.proc.freeze();
    // Still serving in the slices (the probe has not failed yet): the leader waits on it.
    let held = roll_while_frozen(cluster, ns, &replicas[leader], Duration::ZERO).await;
    // Its readiness probe failed: the controller marks the endpoint not serving.
    let dropped = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let dropped_at = Instant::now();
    replica_slice(cluster, service, names[follower], ip, ports[follower].0, false);
    wait_rolled_out(
        cluster,
        ns,
        "the rollout to complete without the replica that is no longer serving",
    )
    .await;
    let done_after_drop = dropped_at.elapsed();
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let held_pod = pods.get(&held.pod).await.unwrap();
    let ready_after_drop = true_since(&held_pod, "Ready").expect("the held pod is Ready") - dropped;
    assert!(
        ready_after_drop >= DELAY_S,
        "the held pod {} was Ready {ready_after_drop} s after the frozen replica dropped out: sooner than the \
         gate's delaySeconds ({DELAY_S} s)",
        held.pod
    );
    let new_waits = gate_waits(&pods, V2).await;
    assert_waits(&new_waits, "rollout without the replica that dropped out");
    // Back: serving again, and it holds the new instances (its own pod watch).
    replicas[follower].server.proc.resume();
    replica_slice(cluster, service, names[follower], ip, ports[follower].0, true);
    wait_for(
        "the replica that was back to hold the 3 new instances UP",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let ups = instances(&replicas[follower].server, "WEB").await;
            let new: Vec<_> = ups.iter().filter(|(_, s)| s == "UP").collect();
            (new.len() == 3
                && new_waits
                    .keys()
                    .all(|p| new.iter().any(|(id, _)| id.starts_with(&format!("{p}.")))))
            .then_some(())
        },
    )
    .await;
    eprintln!(
        "FIGURES readiness_gate_endpointslices: waits {waits:?} s; with a replica frozen the rollout held {:?} \
         (new pod {} ready and UP on the leader {:?} into it); once its endpoint was not serving the held pod was \
         Ready {ready_after_drop} s later and the rollout completed {done_after_drop:?} after; waits {new_waits:?} s",
        held.held, held.pod, held.seen_after
    );
}
