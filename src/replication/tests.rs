//! Routing: where each writer's records go, so that nothing echoes; the senders in [`senders`].

mod senders;

use super::*;

fn rec(writer: Writer, origin: Origin) -> Replication {
    Replication {
        action: ReplicationAction::Register,
        app: "A".into(),
        id: "i".into(),
        last_dirty_timestamp: None,
        status: None,
        overridden_status: None,
        instance: None,
        origin,
        writer,
    }
}

#[test]
fn routing_never_echoes() {
    use Origin::*;
    let t = |replicas, java| Targets { replicas, java };
    // A client's write: everyone.
    assert_eq!(route(&rec(Writer::Client, Native), false), t(true, true));
    // Replicated by one of our replicas: nobody (it already told everyone).
    assert_eq!(route(&rec(Writer::REPLICA, Native), true), t(false, false));
    // Replicated by a Java peer: our replicas only, never back to Java.
    assert_eq!(route(&rec(Writer::JAVA, Replicated), true), t(true, false));
    // Pod instances: Java hears of them from the leader only.
    assert_eq!(route(&rec(Writer::Controller, Pod), false), t(false, false));
    assert_eq!(route(&rec(Writer::Controller, Pod), true), t(false, true));
    // A REST override on a pod instance: the replicas apply it; Java via the leader.
    assert_eq!(route(&rec(Writer::Client, Pod), false), t(true, false));
    assert_eq!(route(&rec(Writer::REPLICA, Pod), true), t(false, true));
    // Evictions (leader only) reach the followers.
    assert_eq!(route(&rec(Writer::Expiry, Native), true), t(true, false));
    // An adopted instance's registration: the client's word to the replicas; what the pod
    // makes of it to Java, from the leader.
    assert_eq!(route(&rec(Writer::Client, Adopted), true), t(true, false));
    assert_eq!(route(&rec(Writer::REPLICA, Adopted), true), t(false, false));
    assert_eq!(route(&rec(Writer::Controller, Adopted), false), t(false, false));
    assert_eq!(route(&rec(Writer::Controller, Adopted), true), t(false, true));
    // Its heartbeats and cancels go everywhere, as a native instance's.
    let mut heartbeat = rec(Writer::Client, Adopted);
    heartbeat.action = ReplicationAction::Heartbeat;
    assert_eq!(route(&heartbeat, false), t(true, true));
}
