//! The instance status rule chain of a non-AWS Java registry:
//! `FirstMatchWins(DownOrStarting, OverrideExists, LeaseExists, AlwaysMatch)`.

use super::instance::Status;

/// The status an instance gets when it registers or renews.
///
/// * `reported`: the status in the registration (or the stored one, on renew);
/// * `override_status`: the override recorded for the instance id, if any;
/// * `existing`: the status of the lease being replaced (on renew, the lease itself);
/// * `replication`: whether the operation came from a peer.
pub fn resolve(
    reported: Status,
    override_status: Option<Status>,
    existing: Option<Status>,
    replication: bool,
) -> Status {
    // DownOrStartingRule: trust DOWN, STARTING and UNKNOWN from the instance or a replica.
    if !matches!(reported, Status::Up | Status::OutOfService) {
        return reported;
    }
    // OverrideExistsRule.
    if let Some(o) = override_status {
        return o;
    }
    // LeaseExistsRule: the server keeps UP/OUT_OF_SERVICE of an existing lease for client calls.
    if !replication && let Some(e @ (Status::Up | Status::OutOfService)) = existing {
        return e;
    }
    // AlwaysMatchInstanceStatusRule.
    reported
}

#[cfg(test)]
mod tests {
    use super::*;
    use Status::*;

    #[test]
    fn down_or_starting_beats_everything() {
        assert_eq!(resolve(Starting, Some(OutOfService), Some(Up), false), Starting);
        assert_eq!(resolve(Down, Some(Up), None, true), Down);
        assert_eq!(resolve(Unknown, Some(Up), Some(Up), false), Unknown);
    }

    #[test]
    fn an_override_beats_a_reported_up() {
        assert_eq!(resolve(Up, Some(OutOfService), None, false), OutOfService);
        assert_eq!(resolve(OutOfService, Some(Up), Some(OutOfService), true), Up);
        assert_eq!(resolve(Up, Some(Unknown), None, false), Unknown);
    }

    #[test]
    fn an_existing_lease_keeps_its_up_or_out_of_service_for_clients_only() {
        // A client re-registering UP cannot leave OUT_OF_SERVICE on its own...
        assert_eq!(resolve(Up, None, Some(OutOfService), false), OutOfService);
        assert_eq!(resolve(OutOfService, None, Some(Up), false), Up);
        // ...but a replica's word is taken.
        assert_eq!(resolve(Up, None, Some(OutOfService), true), Up);
        // An existing DOWN lease does not stick.
        assert_eq!(resolve(Up, None, Some(Down), false), Up);
        assert_eq!(resolve(Up, None, None, false), Up);
    }
}
