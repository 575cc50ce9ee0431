//! The dashboard in a real headless Chromium: what a person sees, including the
//! self-preservation banners.

use std::{net::Ipv4Addr, time::Duration};

use crate::common::{
    browser::Browser,
    eureka::{Native, Server, http},
    process::wait_for,
};

#[tokio::test]
async fn dashboard_shows_status_instances_and_the_emergency_banner() {
    let Some(browser) = Browser::start().await else { return };
    // Self-preservation on, one-second renew windows and no grace: with nobody renewing, the
    // renewals are below the threshold and the EMERGENCY banner shows.
    let server = Server::start(
        Ipv4Addr::new(127, 0, 0, 5),
        &["--renews-window-ms", "1000", "--wait-time-in-ms-when-sync-empty", "0"],
    )
    .await;
    assert_eq!(
        Native::new(&server.url(), "ORDERS", "orders-1")
            .metadata("zone", "zone-a")
            .register()
            .await,
        204
    );
    assert_eq!(
        Native::new(&server.url(), "ORDERS", "orders-2")
            .metadata("zone", "zone-a")
            .register()
            .await,
        204
    );
    assert_eq!(
        Native::new(&server.url(), "BILLING", "billing-1")
            .metadata("zone", "zone-a")
            .register()
            .await,
        204
    );
    http()
        .put(format!(
            "{}apps/ORDERS/orders-2/status?value=OUT_OF_SERVICE",
            server.url()
        ))
        .send()
        .await
        .unwrap();

    let text = wait_for(
        "the dashboard to show the banner",
        Duration::from_secs(15),
        Duration::from_millis(300),
        || async {
            browser.open(&format!("{}/", server.base())).await;
            let text = browser.visible_text().await;
            text.contains("EMERGENCY!").then_some(text)
        },
    )
    .await;
    for expected in [
        "System Status",
        "Renews threshold",
        "Renews (last min)",
        "Lease expiration enabled\tfalse",
        "EMERGENCY! EUREKA MAY BE INCORRECTLY CLAIMING INSTANCES ARE UP WHEN THEY'RE NOT. RENEWALS ARE LESSER THAN THRESHOLD AND HENCE THE INSTANCES ARE NOT BEING EXPIRED JUST TO BE SAFE.",
        "Instances currently registered with Eureka",
        "ORDERS",
        "UP (1) - orders-1",
        "OUT_OF_SERVICE (1) - orders-2",
        "BILLING",
        "zone-a",
        "General Info",
    ] {
        assert!(text.contains(expected), "the page does not show {expected:?}:\n{text}");
    }
    // Instance ids link to their status pages.
    let href = browser
        .eval("return document.querySelector('#instances a').getAttribute('href')")
        .await;
    assert_eq!(href, "http://10.30.0.1:8080/actuator/info");

    browser.open(&format!("{}/lastn", server.base())).await;
    let text = browser.visible_text().await;
    assert!(
        text.contains("ORDERS(orders-1)") && text.contains("BILLING(billing-1)"),
        "{text}"
    );

    // With self-preservation off, Spring's other banner.
    let off = Server::start(Ipv4Addr::new(127, 0, 0, 5), &["--enable-self-preservation", "false"]).await;
    browser.open(&format!("{}/", off.base())).await;
    let text = browser.visible_text().await;
    assert!(
        text.contains(
            "THE SELF PRESERVATION MODE IS TURNED OFF. THIS MAY NOT PROTECT INSTANCE EXPIRY IN CASE OF NETWORK/OTHER PROBLEMS."
        ),
        "{text}"
    );
    assert!(!text.contains("EMERGENCY"), "{text}");
    assert!(text.contains("No instances available"), "{text}");
}
