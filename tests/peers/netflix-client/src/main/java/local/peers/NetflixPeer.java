package local.peers;

import java.io.IOException;
import java.io.OutputStream;
import java.lang.reflect.Field;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.netflix.appinfo.ApplicationInfoManager;
import com.netflix.appinfo.InstanceInfo;
import com.netflix.appinfo.MyDataCenterInstanceConfig;
import com.netflix.appinfo.providers.EurekaConfigBasedInstanceInfoProvider;
import com.netflix.config.ConfigurationManager;
import com.netflix.discovery.DefaultEurekaClientConfig;
import com.netflix.discovery.DiscoveryClient;
import com.netflix.discovery.shared.Application;
import com.sun.jersey.api.client.filter.ClientFilter;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

/**
 * The plain Netflix Eureka client (com.netflix.eureka:eureka-client 1.x, Jersey 1 transport) set up
 * the way Netflix documents it, without Spring: Archaius properties in a namespace,
 * {@code MyDataCenterInstanceConfig}, {@code DefaultEurekaClientConfig}, an
 * {@code ApplicationInfoManager} set UP, and a {@code DiscoveryClient}. One JVM runs one client per
 * {@code --client NAME,SERVICE_URL,json|xml}; each registers as {@code --app} with the instance id
 * {@code <--id>-<NAME>}. A small HTTP server on {@code --port} reports per client:
 * <ul>
 * <li>{@code GET /stats/NAME}: fetch, heartbeat and registration counters (from a filter on the
 * client's own Jersey transport) and the client's own reconcile hash-code mismatch counter;</li>
 * <li>{@code GET /seen-all/NAME/APP}: every instance of APP in the client's local copy, any status;</li>
 * <li>{@code POST /shutdown/NAME}: {@code DiscoveryClient.shutdown()}, which cancels the lease.</li>
 * </ul>
 * SIGTERM shuts every client down the same way.
 */
public final class NetflixPeer {

    private static final ObjectMapper JSON = new ObjectMapper();

    private record Peer(String name, String url, String codec, DiscoveryClient client,
            ApplicationInfoManager info, Wire wire) {
    }

    private static final Map<String, Peer> PEERS = new ConcurrentHashMap<>();

    /** Loopback address and port for the registration, whatever the machine's host name is. */
    private static final class Loopback extends MyDataCenterInstanceConfig {
        private final String host;

        Loopback(String namespace, String host) {
            super(namespace);
            this.host = host;
        }

        @Override
        public String getHostName(boolean refresh) {
            return host;
        }

        @Override
        public String getIpAddress() {
            return host;
        }
    }

    public static void main(String[] args) throws Exception {
        // DiscoveryClient's DEBUG lines carry the hash codes of every fetch and of a mismatch.
        System.setProperty("org.slf4j.simpleLogger.log.com.netflix.discovery.DiscoveryClient", "debug");
        System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
        String host = "127.0.0.1";
        String app = null;
        String id = null;
        int port = 0;
        int appPort = 8080;
        List<String[]> clients = new ArrayList<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--host" -> host = args[i + 1];
                case "--port" -> port = Integer.parseInt(args[i + 1]);
                case "--app-port" -> appPort = Integer.parseInt(args[i + 1]);
                case "--app" -> app = args[i + 1];
                case "--id" -> id = args[i + 1];
                case "--client" -> clients.add(args[i + 1].split(",", 3));
                default -> throw new IllegalArgumentException("unknown argument " + args[i]);
            }
        }
        if (app == null || id == null || port == 0 || clients.isEmpty()) {
            throw new IllegalArgumentException(
                "usage: --port P --app NAME --id PREFIX --client NAME,SERVICE_URL,json|xml [--client ...]");
        }
        HttpServer http = HttpServer.create(new InetSocketAddress(host, port), 16);
        http.createContext("/", NetflixPeer::serve);
        http.start();
        var config = ConfigurationManager.getConfigInstance();
        for (String[] c : clients) {
            String name = c[0];
            String ns = "peer" + name;
            // The property names Netflix documents for eureka-client.properties, under a namespace
            // per client instead of "eureka".
            config.setProperty(ns + ".name", app);
            config.setProperty(ns + ".instanceId", id + "-" + name);
            config.setProperty(ns + ".vipAddress", app.toLowerCase());
            config.setProperty(ns + ".port", appPort);
            config.setProperty(ns + ".lease.renewalInterval", 1);
            config.setProperty(ns + ".lease.duration", 3);
            config.setProperty(ns + ".serviceUrl.default", c[1]);
            config.setProperty(ns + ".shouldUseDns", false);
            config.setProperty(ns + ".preferSameZone", true);
            config.setProperty(ns + ".client.refresh.interval", 1);
            config.setProperty(ns + ".appinfo.replicate.interval", 1);
            config.setProperty(ns + ".appinfo.initial.replicate.time", 1);
            config.setProperty(ns + ".registration.enabled", true);
            config.setProperty(ns + ".shouldFetchRegistry", true);
            config.setProperty(ns + ".shouldOnDemandUpdateStatusChange", true);
            MyDataCenterInstanceConfig instanceConfig = new Loopback(ns, host);
            InstanceInfo instance = new EurekaConfigBasedInstanceInfoProvider(instanceConfig).get();
            ApplicationInfoManager info = new ApplicationInfoManager(instanceConfig, instance);
            Wire wire = new Wire("xml".equals(c[2]));
            DiscoveryClient.DiscoveryClientOptionalArgs optional = new DiscoveryClient.DiscoveryClientOptionalArgs();
            optional.setAdditionalFilters(List.<ClientFilter>of(wire));
            DiscoveryClient client = new DiscoveryClient(info, new DefaultEurekaClientConfig(ns), optional);
            info.setInstanceStatus(InstanceInfo.InstanceStatus.UP);
            PEERS.put(name, new Peer(name, c[1], c[2], client, info, wire));
        }
        Runtime.getRuntime().addShutdownHook(new Thread(() -> PEERS.values().forEach(p -> p.client().shutdown())));
        System.out.println("netflix-peer ready on " + host + ":" + port + " with " + PEERS.keySet());
    }

    private static void serve(HttpExchange ex) throws IOException {
        try (ex) {
            String[] seg = ex.getRequestURI().getPath().replaceAll("^/+|/+$", "").split("/");
            Peer peer = seg.length >= 2 ? PEERS.get(seg[1]) : null;
            Object body;
            int status = 200;
            if (peer == null) {
                status = 404;
                body = Map.of("error", "no such client");
            } else if (seg[0].equals("stats") && seg.length == 2) {
                body = stats(peer);
            } else if (seg[0].equals("seen-all") && seg.length == 3) {
                body = seenAll(peer, seg[2]);
            } else if (seg[0].equals("shutdown") && seg.length == 2 && ex.getRequestMethod().equals("POST")) {
                peer.client().shutdown();
                PEERS.remove(peer.name());
                body = Map.of("shutdown", peer.name());
            } else {
                status = 404;
                body = Map.of("error", "unknown path");
            }
            byte[] bytes = JSON.writeValueAsBytes(body);
            ex.getResponseHeaders().set("Content-Type", "application/json");
            ex.sendResponseHeaders(status, bytes.length);
            try (OutputStream out = ex.getResponseBody()) {
                out.write(bytes);
            }
        } catch (RuntimeException e) {
            byte[] bytes = String.valueOf(e).getBytes(StandardCharsets.UTF_8);
            ex.sendResponseHeaders(500, bytes.length);
            ex.getResponseBody().write(bytes);
        }
    }

    private static List<Map<String, Object>> seenAll(Peer peer, String app) {
        List<Map<String, Object>> out = new ArrayList<>();
        Application application = peer.client().getApplication(app);
        if (application != null) {
            for (InstanceInfo i : application.getInstancesAsIsFromEureka()) {
                Map<String, Object> m = new LinkedHashMap<>();
                m.put("id", i.getId());
                m.put("status", String.valueOf(i.getStatus()));
                m.put("overriddenStatus", String.valueOf(i.getOverriddenStatus()));
                out.add(m);
            }
        }
        return out;
    }

    private static Map<String, Object> stats(Peer peer) {
        Wire w = peer.wire();
        DiscoveryClient c = peer.client();
        InstanceInfo self = peer.info().getInfo();
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("client", peer.name());
        out.put("serviceUrl", peer.url());
        out.put("codec", peer.codec());
        out.put("transport", "Jersey 1 (eureka-client " + DiscoveryClient.class.getPackage().getImplementationVersion() + ")");
        out.put("app", self.getAppName());
        out.put("instanceId", self.getId());
        out.put("fullFetches", w.count("fullFetch"));
        out.put("deltaFetches", w.count("deltaFetch.200"));
        out.put("deltaRefused", w.count("deltaFetch") - w.count("deltaFetch.200"));
        out.put("reconcileMismatches", counter(c, "RECONCILE_HASH_CODES_MISMATCH"));
        out.put("reregistrations", counter(c, "REREGISTER_COUNTER"));
        out.put("registrations", w.count("register.204"));
        out.put("heartbeatsOk", w.count("heartbeat.200"));
        out.put("cancels", w.count("cancel.200"));
        out.put("lastFetchContentType", w.lastFetchType());
        out.put("http", w.snapshot());
        out.put("localStatus", String.valueOf(self.getStatus()));
        out.put("remoteStatus", String.valueOf(c.getInstanceRemoteStatus()));
        out.put("localAppsHashCode", c.getApplications().getAppsHashCode());
        return out;
    }

    /** One of DiscoveryClient's own (per-instance, private) Servo counters. */
    private static long counter(DiscoveryClient client, String field) {
        try {
            Field f = DiscoveryClient.class.getDeclaredField(field);
            f.setAccessible(true);
            return ((com.netflix.servo.monitor.Counter) f.get(client)).getValue().longValue();
        } catch (ReflectiveOperationException e) {
            return -1;
        }
    }
}
