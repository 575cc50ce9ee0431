package local.peers;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.TreeMap;

import ch.qos.logback.classic.spi.ILoggingEvent;
import ch.qos.logback.core.AppenderBase;

/**
 * Logback appender on the logger {@code com.netflix.discovery.DiscoveryClient} (at DEBUG, see
 * logback-spring.xml) that turns the client's own log events into counters. It matches the
 * message pattern before its arguments are filled in; these patterns are the same in
 * eureka-client 1.9.x, 1.10.x and 2.0.x. One Eureka client runs per JVM, so the counters are global.
 */
public class EurekaEvents extends AppenderBase<ILoggingEvent> {

    private static final Map<String, Long> COUNTS = new TreeMap<>();

    @Override
    protected void append(ILoggingEvent event) {
        String msg = event.getMessage();
        if (msg == null) {
            return;
        }
        Object[] args = event.getArgumentArray();
        String arg1 = args != null && args.length > 1 ? String.valueOf(args[1]) : "?";
        if (msg.startsWith("Getting all instance registry info from the eureka server")) {
            add("fullFetches");
        } else if (msg.startsWith("Got delta update with apps hashcode")) {
            add("deltaFetches");
        } else if (msg.startsWith("The server does not allow the delta revision to be applied")) {
            add("deltaRefused");
        } else if (msg.startsWith("The Reconcile hashcodes do not match")) {
            add("reconcileMismatchesLogged");
        } else if (msg.contains(" - registration status: ")) {
            add(arg1.equals("204") ? "registrations" : "registrationsNotOk");
        } else if (msg.contains(" - Heartbeat status: ")) {
            add("heartbeatStatus." + arg1);
            if (arg1.equals("200")) {
                add("heartbeatsOk");
            }
        } else if (msg.contains(" - Re-registering apps/")) {
            add("reregistrationsLogged");
        } else if (msg.contains(" - deregister  status: ")) {
            add(arg1.equals("200") ? "cancels" : "cancelsNotOk");
        } else if (msg.contains("was unable to refresh its cache")) {
            add("fetchErrors");
        }
    }

    private static void add(String key) {
        synchronized (COUNTS) {
            COUNTS.merge(key, 1L, Long::sum);
        }
    }

    static Map<String, Object> snapshot() {
        Map<String, Object> out = new LinkedHashMap<>();
        synchronized (COUNTS) {
            for (String k : new String[] {"fullFetches", "deltaFetches", "deltaRefused", "reconcileMismatchesLogged",
                    "registrations", "registrationsNotOk", "heartbeatsOk", "reregistrationsLogged", "cancels",
                    "fetchErrors"}) {
                out.put(k, COUNTS.getOrDefault(k, 0L));
            }
            Map<String, Long> byStatus = new TreeMap<>();
            COUNTS.forEach((k, v) -> {
                if (k.startsWith("heartbeatStatus.")) {
                    byStatus.put(k.substring("heartbeatStatus.".length()), v);
                }
            });
            out.put("heartbeatsByStatus", byStatus);
        }
        return out;
    }
}
