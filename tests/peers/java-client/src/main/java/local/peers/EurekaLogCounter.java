package local.peers;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import ch.qos.logback.classic.spi.ILoggingEvent;
import ch.qos.logback.core.AppenderBase;

/**
 * Logback appender (wired in logback-spring.xml on the logger
 * {@code com.netflix.discovery.DiscoveryClient} at DEBUG) that turns the client's own log
 * events into counters.
 *
 * <p>eureka-client 2.0.4 has no public counter for "full fetch" vs "delta fetch" and keeps its
 * Spectator counters private, so the log events are the most direct signal. It matches the
 * message <em>pattern</em> ({@link ILoggingEvent#getMessage()}, before the arguments are filled
 * in), which is a compile-time constant in DiscoveryClient. Line numbers refer to
 * eureka-client/src/main/java/com/netflix/discovery/DiscoveryClient.java at tag v2.0.4.
 */
public class EurekaLogCounter extends AppenderBase<ILoggingEvent> {

    /** getAndStoreFullRegistry(), INFO, before GET apps/ (l.1042). */
    static final String FULL_FETCH = "Getting all instance registry info from the eureka server";
    /** getAndStoreFullRegistry(), DEBUG, after a full registry was stored (l.1057). */
    static final String FULL_STORED = "Got full registry with apps hashcode";
    /** getAndUpdateDelta(), DEBUG, after GET apps/delta returned 200 (l.1090). */
    static final String DELTA_FETCH = "Got delta update with apps hashcode";
    /** getAndUpdateDelta(), WARN, GET apps/delta was not 200, falls back to a full fetch (l.1086). */
    static final String DELTA_REFUSED = "The server does not allow the delta revision to be applied";
    /** reconcileAndLogDifference(), DEBUG, hashcode mismatch, then GET apps/ (l.1145). */
    static final String RECONCILE = "The Reconcile hashcodes do not match";
    /** register(), INFO, after POST apps/{APP} (l.834); argument 1 is the HTTP status. */
    static final String REGISTERED = " - registration status: ";
    /** register(), WARN, the POST threw (l.830). */
    static final String REGISTER_FAILED = " - registration failed ";
    /** renew(), DEBUG, after PUT apps/{APP}/{id} (l.846); argument 1 is the HTTP status. */
    static final String HEARTBEAT = " - Heartbeat status: ";
    /** renew(), INFO, the heartbeat got 404 and the client registers again (l.849). */
    static final String REREGISTER = " - Re-registering apps/";
    /** renew(), ERROR, the PUT threw (l.859). */
    static final String HEARTBEAT_ERROR = " - was unable to send heartbeat!";
    /** fetchRegistry() / getApplications(), INFO, a fetch failed (l.812, 815, 968). */
    static final String FETCH_FAILED = "was unable to refresh its cache!";
    /** unregister(), INFO, after DELETE apps/{APP}/{id} (l.920); argument 1 is the HTTP status. */
    static final String DEREGISTERED = " - deregister  status: ";

    private static final Map<String, AtomicLong> COUNTS = new ConcurrentHashMap<>();
    private static volatile String lastDeltaHashCode;
    private static volatile String lastFullHashCode;
    private static volatile String lastMismatchClient;
    private static volatile String lastMismatchServer;

    @Override
    protected void append(ILoggingEvent event) {
        String msg = event.getMessage();
        if (msg == null) {
            return;
        }
        Object[] args = event.getArgumentArray();
        if (msg.startsWith(FULL_FETCH)) {
            inc("fullFetches");
        } else if (msg.startsWith(FULL_STORED)) {
            lastFullHashCode = arg(args, 0);
        } else if (msg.startsWith(DELTA_FETCH)) {
            inc("deltaFetches");
            lastDeltaHashCode = arg(args, 0);
        } else if (msg.startsWith(DELTA_REFUSED)) {
            inc("deltaRefused");
        } else if (msg.startsWith(RECONCILE)) {
            inc("reconcileMismatches");
            lastMismatchClient = arg(args, 0);
            lastMismatchServer = arg(args, 1);
        } else if (msg.contains(HEARTBEAT)) {
            inc("200".equals(arg(args, 1)) ? "heartbeatsOk" : "heartbeatsNotOk");
            inc("heartbeatStatus." + arg(args, 1));
        } else if (msg.contains(REREGISTER)) {
            inc("reregistrations");
        } else if (msg.contains(REGISTERED)) {
            inc("204".equals(arg(args, 1)) ? "registrationsOk" : "registrationsNotOk");
        } else if (msg.contains(REGISTER_FAILED)) {
            inc("registrationErrors");
        } else if (msg.contains(HEARTBEAT_ERROR)) {
            inc("heartbeatErrors");
        } else if (msg.contains(FETCH_FAILED)) {
            inc("fetchErrors");
        } else if (msg.contains(DEREGISTERED)) {
            inc("deregistrations");
        }
    }

    private static String arg(Object[] args, int i) {
        return args != null && args.length > i && args[i] != null ? String.valueOf(args[i]) : null;
    }

    private static void inc(String key) {
        COUNTS.computeIfAbsent(key, k -> new AtomicLong()).incrementAndGet();
    }

    static long get(String key) {
        AtomicLong v = COUNTS.get(key);
        return v == null ? 0 : v.get();
    }

    /** Every counter, with zeros for the well-known ones, plus the last hashcodes seen. */
    static Map<String, Object> snapshot() {
        Map<String, Object> out = new LinkedHashMap<>();
        for (String k : new String[] {"fullFetches", "deltaFetches", "deltaRefused", "reconcileMismatches",
                "fetchErrors", "registrationsOk", "registrationsNotOk", "registrationErrors", "reregistrations",
                "heartbeatsOk", "heartbeatsNotOk", "heartbeatErrors", "deregistrations"}) {
            out.put(k, get(k));
        }
        Map<String, Long> byStatus = new LinkedHashMap<>();
        COUNTS.entrySet().stream()
            .filter(e -> e.getKey().startsWith("heartbeatStatus."))
            .sorted(Map.Entry.comparingByKey())
            .forEach(e -> byStatus.put(e.getKey().substring("heartbeatStatus.".length()), e.getValue().get()));
        out.put("heartbeatsByStatus", byStatus);
        out.put("lastFullHashCode", lastFullHashCode);
        out.put("lastDeltaHashCode", lastDeltaHashCode);
        out.put("lastMismatchClientHashCode", lastMismatchClient);
        out.put("lastMismatchServerHashCode", lastMismatchServer);
        return out;
    }
}
