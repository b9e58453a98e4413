//! Charge and settle, an operator's changes of a subject, and calendar windows, on a real
//! redis-server that the test starts on a free loopback port: each operation once, on the
//! server's own clock, beside a subject and a limiter it must not touch; and each counted.
//!
//! Skipped (with a line saying so) where redis-server is not installed; failing instead under CI.
#![cfg(all(feature = "redis", feature = "metrics"))]

use std::time::Duration;

use atomic_limiter::redis::RedisCalendarWindow;
use atomic_limiter::redis::{LeaseOptions, Leased, RedisGcra, RedisOptions, RedisStore};
use atomic_limiter::{Calendar, CalendarWindow, LimiterMetrics, Quota};
use metrics_util::debugging::DebuggingRecorder;

#[path = "common/redis_server.rs"]
mod redis_server;

#[path = "common/counters.rs"]
mod counters;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// 100 an hour (36 s a token): nothing refills noticeably while the test runs.
fn hourly() -> Quota {
    Quota::per_hour(100)
}

async fn limiter(url: &str, prefix: &str, o: RedisOptions) -> RedisGcra {
    let o = o.with_deadline(Duration::from_secs(1));
    let store = RedisStore::connect(url, &o).await.unwrap();
    RedisGcra::with_limits(store, prefix, [("q", hourly())], o).unwrap()
}

async fn left(l: &RedisGcra, subject: &str) -> u64 {
    l.check_n(subject, 0).await.unwrap().remaining()
}

#[test]
fn each_operation_changes_its_own_subject_only_and_is_counted() {
    let Some(server) = redis_server::RedisServer::start("redis_admin") else {
        return;
    };
    let recorder = DebuggingRecorder::new();
    let o = metrics::with_local_recorder(&recorder, || {
        RedisOptions::default().with_metrics(LimiterMetrics::new("admin"))
    });
    runtime().block_on(async {
        let l = limiter(&server.url(), "t", o).await;
        let other = limiter(&server.url(), "u", RedisOptions::default()).await;
        // A bystander on the same limiter, and the same subject on another prefix.
        assert!(l.check_n("bystander", 10).await.unwrap().is_allowed());
        assert!(other.check_n("alice", 5).await.unwrap().is_allowed());

        // A charge of 50 settled at 20 gives 30 back.
        let charge = l.charge("alice", 50).await.unwrap();
        assert!(charge.is_allowed());
        assert_eq!(charge.decision().remaining(), 50);
        charge.settle(20).await.unwrap();
        assert_eq!(left(&l, "alice").await, 80);
        // A charge of 10 settled at 40 owes 30 more.
        l.charge("alice", 10)
            .await
            .unwrap()
            .settle(40)
            .await
            .unwrap();
        assert_eq!(left(&l, "alice").await, 40);
        // A charge dropped stands at its estimate.
        drop(l.charge("alice", 5).await.unwrap());
        assert_eq!(left(&l, "alice").await, 35);
        // A refused charge settles nothing.
        let refused = l.charge("alice", 36).await.unwrap();
        assert!(!refused.is_allowed());
        refused.settle(0).await.unwrap();
        assert_eq!(left(&l, "alice").await, 35);

        // A penalty past the burst: 100 held, 150 taken, 50 owed: the next token waits 51
        // periods of 36 s, less the microseconds since.
        l.penalize("mallory", 150).await.unwrap();
        let d = l.check("mallory").await;
        assert!(d.is_denied());
        let want = Duration::from_secs(51 * 36);
        assert!(
            d.retry_after() <= want && d.retry_after() > want - Duration::from_secs(1),
            "{d:?}"
        );

        // A block of ten minutes, answered with that retry-after.
        l.block("abuser", Duration::from_secs(600)).await.unwrap();
        let d = l.check("abuser").await;
        assert!(d.is_denied());
        let want = Duration::from_secs(600);
        assert!(
            d.retry_after() <= want && d.retry_after() > want - Duration::from_secs(1),
            "{d:?}"
        );

        // A reset makes a subject full; a removal forgets it; an unknown one was not held.
        assert!(l.reset("mallory").await.unwrap());
        assert_eq!(left(&l, "mallory").await, 100);
        assert!(l.check("mallory").await.is_allowed());
        assert!(l.remove("abuser").await.unwrap());
        assert!(l.check("abuser").await.is_allowed());
        assert!(!l.remove("nobody").await.unwrap());

        // Nothing else moved.
        assert_eq!(left(&l, "bystander").await, 90);
        assert_eq!(left(&other, "alice").await, 95);
    });
    let c = counters::counters(&recorder);
    assert_eq!(
        counters::admin_counts(&c, "admin"),
        [2, 1, 1, 1, 2],
        "{c:?}"
    );
}

/// A charge from a lease settles there: a surplus back into the lease and an excess the lease
/// holds spent from it, with no call; an excess past it owed to the store, in one call.
#[test]
fn a_leased_charge_settles_locally_unless_the_lease_falls_short() {
    let Some(server) = redis_server::RedisServer::start("redis_admin_leased") else {
        return;
    };
    runtime().block_on(async {
        let remote = limiter(&server.url(), "l", RedisOptions::default()).await;
        let leased = Leased::new(
            remote.clone(),
            "fleet",
            LeaseOptions::default().with_max_lease(50),
        );
        let charge = leased.charge(20).await.unwrap();
        assert!(charge.is_allowed(), "{:?}", charge.decision());
        assert!(
            !charge.settle(5).await.unwrap(),
            "a surplus goes back to the lease"
        );
        let charge = leased.charge(5).await.unwrap();
        assert!(charge.is_allowed());
        assert!(
            !charge.settle(8).await.unwrap(),
            "an excess the lease holds"
        );
        // The store granted the lease; the subject owes nothing past it yet.
        let before = remote.check_n("fleet", 0).await.unwrap().remaining();
        let charge = leased.charge(1).await.unwrap();
        assert!(charge.is_allowed());
        assert!(
            charge.settle(400).await.unwrap(),
            "an excess past the lease: one call"
        );
        // 399 more owed on the store: 100 an hour held at most, so the subject is in debt.
        let after = remote.check("fleet").await;
        assert!(after.is_denied(), "{after:?} (had {before})");
        assert!(after.retry_after() > Duration::from_secs(3600), "{after:?}");
    });
}

/// A calendar window on the server's clock: the limit per period, then a refusal until the
/// period ends, as the local window on the system's clock says (the same host, so the same time
/// within the call's few milliseconds).
#[test]
fn a_calendar_window_counts_on_the_servers_clock() {
    let Some(server) = redis_server::RedisServer::start("redis_admin_calendar") else {
        return;
    };
    runtime().block_on(async {
        let o = RedisOptions::default().with_deadline(Duration::from_secs(1));
        let store = RedisStore::connect(&server.url(), &o).await.unwrap();
        let plan = RedisCalendarWindow::new(store, "plan", 3, Calendar::Year, o);
        for left in [2, 1, 0] {
            let d = plan.check("customer").await;
            assert!(d.is_allowed() && d.remaining() == left, "{d:?}");
        }
        let refused = plan.check("customer").await;
        assert!(refused.is_denied());
        let local = CalendarWindow::new(3, Calendar::Year).check();
        let gap = refused.retry_after().abs_diff(local.reset_after());
        assert!(
            gap < Duration::from_secs(5),
            "{refused:?} against {local:?}"
        );
        // Another subject has its own count; a peek takes nothing.
        assert_eq!(plan.check_n("other", 0).await.unwrap().remaining(), 3);
        assert!(
            plan.check_n("customer", 4).await.is_err(),
            "more than the limit"
        );
        assert_eq!(plan.key("customer"), "plan:{=customer}:year");
    });
}
