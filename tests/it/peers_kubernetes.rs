//! Smoke tests proving the Kubernetes test peer is real: objects go through a real kube-apiserver
//! backed by etcd, RBAC is enforced, and impersonation works.

use std::time::Duration;

use crate::common::{cluster::Cluster, process::wait_for};
use k8s_openapi::api::core::v1::{Namespace, Pod, PodCondition, PodStatus};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

async fn namespace(client: &kube::Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

#[tokio::test]
async fn pod_status_written_like_a_kubelet_reads_back() {
    let Some(cluster) = Cluster::shared() else { return };
    let client = cluster.admin().await;
    namespace(&client, "smoke-pods").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "smoke-pods");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web-0", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "example/web:1",
                                  "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();

    // No kubelet runs here: the test writes the status subresource as a kubelet would.
    let status = PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some("10.1.0.7".into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    pods.patch_status(
        "web-0",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .unwrap();

    let back = pods.get("web-0").await.unwrap();
    let st = back.status.unwrap();
    assert_eq!(st.pod_ip.as_deref(), Some("10.1.0.7"));
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert!(
        st.conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );
    assert_eq!(
        back.spec.unwrap().containers[0].ports.as_ref().unwrap()[0].container_port,
        8080
    );

    // kubectl, the other real client, sees the same object.
    let out = cluster.kubectl_ok(&[
        "get",
        "pod",
        "web-0",
        "-n",
        "smoke-pods",
        "-o",
        "jsonpath={.status.podIP}",
    ]);
    assert_eq!(out, "10.1.0.7");
}

#[tokio::test]
async fn applied_crd_is_served() {
    let Some(cluster) = Cluster::shared() else { return };
    let client = cluster.admin().await;
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "widgets.smoke.example.com"},
        "spec": {
            "group": "smoke.example.com",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer", "minimum": 1}}}}}}}]
        }
    }))
    .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    namespace(&client, "smoke-crd").await;

    let manifest =
        "apiVersion: smoke.example.com/v1\nkind: Widget\nmetadata: {name: w1, namespace: smoke-crd}\nspec: {size: 3}\n";
    let path = std::env::temp_dir().join(format!("eo-widget-{}.yaml", std::process::id()));
    std::fs::write(&path, manifest).unwrap();
    // The CRD becomes servable asynchronously: wait until kubectl can create a Widget.
    wait_for(
        "the Widget CRD to be served",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let out = cluster.kubectl().args(["apply", "-f"]).arg(&path).output().unwrap();
            out.status.success().then_some(())
        },
    )
    .await;
    let size = cluster.kubectl_ok(&["get", "widget", "w1", "-n", "smoke-crd", "-o", "jsonpath={.spec.size}"]);
    assert_eq!(size, "3");

    // The structural schema is enforced by the real apiserver.
    std::fs::write(&path, manifest.replace("size: 3", "size: 0")).unwrap();
    let out = cluster.kubectl().args(["apply", "-f"]).arg(&path).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.size"), "{out:?}");
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn rbac_is_enforced_for_an_impersonated_service_account() {
    let Some(cluster) = Cluster::shared() else { return };
    let admin = cluster.admin().await;
    namespace(&admin, "smoke-rbac").await;
    let sa = cluster.client_as("system:serviceaccount:smoke-rbac:reader").await;
    let pods: Api<Pod> = Api::namespaced(sa.clone(), "smoke-rbac");
    let err = pods.list(&Default::default()).await.unwrap_err();
    assert!(matches!(&err, kube::Error::Api(s) if s.code == 403), "{err:?}");

    cluster.kubectl_ok(&[
        "create",
        "role",
        "pod-reader",
        "-n",
        "smoke-rbac",
        "--verb=list",
        "--resource=pods",
    ]);
    cluster.kubectl_ok(&[
        "create",
        "rolebinding",
        "reader",
        "-n",
        "smoke-rbac",
        "--role=pod-reader",
        "--serviceaccount=smoke-rbac:reader",
    ]);
    // RBAC caches refresh asynchronously; the grant becomes visible within moments.
    wait_for(
        "the role binding to take effect",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || {
            let pods = pods.clone();
            async move { pods.list(&Default::default()).await.ok() }
        },
    )
    .await;
    // Still no write access.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "x"}, "spec": {"containers": [{"name": "x", "image": "x"}]}
    }))
    .unwrap();
    let err = pods.create(&PostParams::default(), &pod).await.unwrap_err();
    assert!(matches!(&err, kube::Error::Api(s) if s.code == 403), "{err:?}");
}
