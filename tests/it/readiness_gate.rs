//! The readiness gate (EurekaApp `readinessGate`), with kube-controller-manager rolling a real
//! Deployment on kwok's fake nodes (kwok plays the kubelet: a pod with readiness gates is Ready
//! only once its gate condition is True). The leader opens a pod's gate only once every ready
//! replica holds its instance UP, plus the configured delay; a rollout waits for that.

use std::{collections::HashMap, time::Duration};

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;

use crate::{
    common::{
        operator::{eureka_app, instances, namespace},
        process::wait_for,
    },
    faults::{leader_of, two_replicas},
    lifecycle::{apply, lifecycle_cluster, rolled_out},
};

const GATE: &str = "eureka-operator.dev/registered";

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

/// Seconds between a pod's `ContainersReady` and `Ready` conditions, by pod.
async fn gate_waits(pods: &Api<Pod>) -> HashMap<String, i64> {
    let list = pods.list(&ListParams::default().labels("app=web")).await.unwrap();
    list.items
        .iter()
        .filter_map(|p| {
            let conds = p.status.as_ref()?.conditions.as_ref()?;
            let at = |t: &str| {
                conds
                    .iter()
                    .find(|c| c.type_ == t && c.status == "True")
                    .and_then(|c| c.last_transition_time.as_ref())
                    .map(|t| t.0.as_second())
            };
            Some((p.metadata.name.clone()?, at("Ready")? - at("ContainersReady")?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_waits_until_every_replica_has_the_instance() {
    let Some(cluster) = lifecycle_cluster() else { return };
    let client = cluster.admin().await;
    let ns = "gate";
    namespace(&client, ns).await;
    let replicas = two_replicas(cluster, ns, "gate", 201, &[]).await;
    eureka_app(
        cluster,
        ns,
        "web",
        &format!(
            "  selector: {{matchLabels: {{app: web}}}}\n  port: http\n  drainSeconds: 1\n  readinessGate: {{conditionType: {GATE}, delaySeconds: 2}}\n"
        ),
    );
    apply(cluster, &gated_deployment(ns, "example/web:1"));
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
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
    for r in &replicas {
        let ups = instances(&r.server, "WEB").await;
        assert_eq!(ups.iter().filter(|(_, s)| s == "UP").count(), 3, "{ups:?}");
    }
    let waits = gate_waits(&pods).await;
    assert_eq!(waits.len(), 3, "{waits:?}");
    assert!(
        waits.values().all(|w| *w >= 1),
        "pods became Ready before the 2 s gate delay: {waits:?}"
    );

    // Freeze the follower: the leader can no longer see the new instances everywhere, so new pods
    // stay not Ready and the rollout does not move.
    let leader = leader_of(&replicas).await;
    let follower = &replicas[1 - leader];
    follower.server.proc.freeze();
    let roll = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "example/web:2"}]}}}});
    deployments
        .patch("web", &PatchParams::default(), &Patch::Strategic(&roll))
        .await
        .unwrap();
    let frozen = Duration::from_secs(8);
    let started = std::time::Instant::now();
    while started.elapsed() < frozen {
        let d = deployments.get("web").await.unwrap();
        let status = d.status.unwrap_or_default();
        assert!(
            status.available_replicas.unwrap_or(0) >= 3,
            "an old pod went before a new one was visible everywhere: {status:?}"
        );
        let updated_ready = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| {
                p.spec
                    .as_ref()
                    .is_some_and(|s| s.containers[0].image.as_deref() == Some("example/web:2"))
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        assert_eq!(
            updated_ready, 0,
            "a new pod became Ready while a replica could not confirm it"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    follower.server.proc.resume();
    let resumed = std::time::Instant::now();
    wait_for(
        "the rollout to complete after the replica is back",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async {
            let d = deployments.get("web").await.ok()?;
            rolled_out(&d, 3).then_some(())
        },
    )
    .await;
    eprintln!(
        "FIGURES readiness_gate: waits {waits:?} s; the rollout held {frozen:?} while a replica was frozen, then completed {:?} after it resumed",
        resumed.elapsed()
    );
}
