//! Heap the controller side keeps per pod, counted by a wrapping global allocator (glibc chunk
//! sizes, from `malloc_usable_size`, plus the chunk header), so the figures are exact and do not
//! depend on the machine's load:
//!
//! * per watched pod: a Deployment's pods as the apiserver lists them (managedFields, whole spec
//!   and status), read as the watch reads them and kept in the index;
//! * per registered pod: the same pods selected by an EurekaApp, planned and registered, with the
//!   full registry and the delta fetched once in JSON and XML, gzip (what clients ask for), so the
//!   registry, its change log and the cached payload fragments are all counted.
//!
//! `cargo bench --bench controller_memory` (`EO_MEM_PODS`, default 5000: 100 namespaces of 50).
//! The RSS of a real operator against a real apiserver is printed by `tests/it/scale.rs`.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicIsize, Ordering},
    },
};

use eureka_operator::{
    cache::PayloadKey,
    codec::Format,
    k8s::{
        crd::EurekaAppSpec,
        index::{Index, Scope},
        plan::{self, Facts, Target},
        pods::{Interner, PodInfo, WatchedPod},
    },
    registry::{Command, Registry, RegistryConfig},
    state::{AppState, Clock, SystemClock},
};
use serde_json::json;

/// Live heap bytes, as glibc counts them.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

/// glibc's per-chunk header.
const HEADER: usize = std::mem::size_of::<usize>();

fn usable(p: *mut u8) -> isize {
    // SAFETY: `p` was returned by the system allocator and not freed yet.
    (unsafe { libc::malloc_usable_size(p.cast()) } + HEADER) as isize
}

// SAFETY: every call is forwarded to `System`; the counting only reads the chunk size.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(usable(p), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        LIVE.fetch_sub(usable(p), Ordering::Relaxed);
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let before = usable(p);
        // SAFETY: forwarded as is.
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            LIVE.fetch_add(usable(q) - before, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

const PER_NAMESPACE: usize = 50;
const NODES: usize = 20;

/// A Deployment's pod as the apiserver returns it in a list.
fn pod_json(ns: usize, i: usize) -> String {
    let hash = format!("{:010x}", ns * 7919 + 12345);
    let name = format!("svc-{hash}-{i:05x}");
    let ip = format!("10.{}.{}.{}", ns % 250, i / 250, i % 250 + 1);
    let node = format!("node-{}", (ns * PER_NAMESPACE + i) % NODES);
    let time = "2026-11-30T10:00:00Z";
    let conditions: Vec<serde_json::Value> = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ]
    .iter()
    .map(|t| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": time}))
    .collect();
    let field = |f: &str| json!({"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": time, "fieldsType": "FieldsV1", "fieldsV1": {f: {}}, "subresource": "status"});
    json!({
        "metadata": {
            "name": name, "generateName": format!("svc-{hash}-"), "namespace": format!("ns-{ns:03}"),
            "uid": format!("{:08x}-1f2e-4d3c-8b7a-{:012x}", ns, i), "resourceVersion": format!("{}", 1000 + i),
            "creationTimestamp": time,
            "labels": {"app": "svc", "pod-template-hash": hash},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("svc-{hash}"),
                "uid": "6a1b2c3d-0000-4000-8000-000000000001", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [field("f:metadata"), field("f:spec"), field("f:status")]
        },
        "spec": {
            "containers": [{"name": "app", "image": "registry.example/svc:1.2.3", "imagePullPolicy": "IfNotPresent",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                "readinessProbe": {"httpGet": {"path": "/actuator/health", "port": 8080, "scheme": "HTTP"}},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "volumeMounts": [{"name": "kube-api-access", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "nodeName": node,
            "securityContext": {}, "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": format!("192.168.0.{}", (ns * PER_NAMESPACE + i) % NODES + 1),
            "hostIPs": [{"ip": format!("192.168.0.{}", (ns * PER_NAMESPACE + i) % NODES + 1)}],
            "podIP": ip, "podIPs": [{"ip": ip}], "startTime": time, "qosClass": "Burstable",
            "containerStatuses": [{"name": "app", "state": {"running": {"startedAt": time}}, "ready": true,
                "restartCount": 0, "image": "registry.example/svc:1.2.3", "imageID": "registry.example/svc@sha256:0123",
                "containerID": format!("containerd://{:064x}", ns * 100_000 + i), "started": true}]
        }
    })
    .to_string()
}

/// Every pod read as the watch reads it and applied to the index (added, or changed).
fn watch_all(index: &mut Index, interner: &mut Interner, pods: usize) {
    for n in 0..pods {
        let (ns, i) = (n / PER_NAMESPACE, n % PER_NAMESPACE);
        let watched: WatchedPod = serde_json::from_str(&pod_json(ns, i)).unwrap();
        index.apply_pod(PodInfo::from_watched(&watched, interner).unwrap());
    }
}

fn main() {
    let pods: usize = std::env::var("EO_MEM_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let namespaces = pods.div_ceil(PER_NAMESPACE);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();

    // Watched: what the index keeps.
    let mut index = Index::new(vec![Scope::All]);
    let mut interner = Interner::default();
    let before = live();
    watch_all(&mut index, &mut interner, pods);
    let watched = live() - before;
    assert_eq!(index.pod_count(), pods);
    // Every pod changes once (a status update, as the watch delivers it): nothing may pile up.
    watch_all(&mut index, &mut interner, pods);
    let updated = live() - before;

    // Registered: every namespace's EurekaApp selects its pods.
    let state = AppState::new(
        Registry::new(RegistryConfig::default(), SystemClock.now_ms()),
        Arc::new(SystemClock),
        false,
        Default::default(),
    );
    let spec: EurekaAppSpec =
        serde_json::from_value(json!({"selector": {"matchLabels": {"app": "svc"}}, "port": "http"})).unwrap();
    let zones = BTreeMap::new();
    let mut one_instance = 0isize;
    let before = live();
    for ns in 0..namespaces {
        let namespace = format!("ns-{ns:03}");
        let snapshot = index.snapshot(&namespace);
        let target = Target {
            namespace: &namespace,
            name: "svc",
            spec: &spec,
        };
        let ctx = Facts {
            cluster_id: "bench",
            cluster_name: "bench",
            cluster_domain: "cluster.local",
            node_zones: &zones,
            now: state.now(),
        };
        let plan = plan::plan(&target, snapshot.pods.iter().map(|p| p.as_ref()), &ctx);
        drop(snapshot);
        if ns == 0 && !plan.desired.is_empty() {
            // A stored instance: the struct behind its `Arc` and everything it owns, averaged over
            // the first namespace's (one chunk's size depends on where the allocator finds room).
            let mut copies = Vec::with_capacity(plan.desired.len());
            let mark = live();
            copies.extend(plan.desired.iter().map(|d| Arc::new(d.info.clone())));
            one_instance = (live() - mark) / copies.len() as isize;
        }
        for d in plan.desired {
            state.apply(Command::UpsertPod {
                info: d.info,
                owner: d.owner,
                overrides: d.overrides,
            });
        }
    }
    let registry_only = live() - before;
    let payloads: Vec<_> = runtime.block_on(async {
        let mut out = Vec::new();
        for key in [PayloadKey::Full, PayloadKey::Delta] {
            for format in [Format::Json, Format::Xml] {
                let p = state.payload(key.clone(), format).await;
                p.gzip();
                out.push(p);
            }
        }
        out
    });
    let wire: usize = payloads.iter().map(|p| p.gzip().len() as usize).sum();
    // The payloads served are the clients' to hold; what the server keeps is its cache.
    drop(payloads);
    let registered = live() - before;

    let per_pod = |bytes: isize| bytes as f64 / pods as f64;
    println!("| figure ({pods} pods, {namespaces} namespaces) | bytes per pod |");
    println!("|---|---:|");
    println!("| watched pod (index) | {:.0} |", per_pod(watched));
    println!("| watched pod, after one update of each | {:.0} |", per_pod(updated));
    println!(
        "| registered pod: registry and change log | {:.0} |",
        per_pod(registry_only)
    );
    println!("| of which a stored instance (`Arc<InstanceInfo>` and what it owns) | {one_instance} |");
    println!(
        "| registered pod: with cached full and delta payloads (JSON and XML, gzip) | {:.0} |",
        per_pod(registered)
    );
    println!(
        "| registered pod, watch included | {:.0} |",
        per_pod(registered + watched)
    );
    println!("(gzip payloads served: {wire} bytes in all)");
    println!(
        "(sizes: PodInfo {} B, InstanceInfo {} B)",
        std::mem::size_of::<PodInfo>(),
        std::mem::size_of::<eureka_operator::registry::instance::InstanceInfo>()
    );
}
