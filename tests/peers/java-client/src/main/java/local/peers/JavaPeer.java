package local.peers;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;

import com.netflix.appinfo.ApplicationInfoManager;
import com.netflix.appinfo.InstanceInfo;
import com.netflix.discovery.AbstractDiscoveryClientOptionalArgs;
import com.netflix.discovery.DiscoveryClient;
import com.netflix.discovery.EurekaClient;
import com.netflix.discovery.shared.Application;
import com.netflix.discovery.shared.Applications;
import com.netflix.spectator.api.Counter;
import com.netflix.spectator.api.DefaultRegistry;
import com.netflix.spectator.api.Registry;
import com.netflix.spectator.api.Spectator;
import com.netflix.spectator.api.Timer;

import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.cloud.client.ServiceInstance;
import org.springframework.cloud.client.discovery.event.HeartbeatEvent;
import org.springframework.cloud.util.ProxyUtils;
import org.springframework.context.event.EventListener;
import org.springframework.http.ResponseEntity;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.PathVariable;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RestController;

/**
 * Java Eureka client test peer: a plain Spring Cloud Netflix client (registers, renews,
 * fetches full + delta, deregisters on SIGTERM) with a few read-only JSON endpoints that the
 * Rust tests poll:
 * <ul>
 * <li>{@code GET /seen/{app}}: instance ids that Spring's DiscoveryClient returns (UP only);</li>
 * <li>{@code GET /seen-all/{app}}: every instance of the app in the local registry copy, any status;</li>
 * <li>{@code GET /stats}: fetch/heartbeat/registration counters (see EurekaLogCounter, WireLog);</li>
 * <li>{@code GET /wire}: the last 500 requests the client sent to the Eureka server;</li>
 * <li>{@code POST /local-status/{status}}: set this instance's own status (UP, DOWN, ...).</li>
 * </ul>
 */
@SpringBootApplication
@RestController
public class JavaPeer {

    /** Added to Spectator's global registry before the Eureka client creates its meters. */
    static final Registry SPECTATOR = new DefaultRegistry();

    private final org.springframework.cloud.client.discovery.DiscoveryClient discovery;
    private final ObjectProvider<EurekaClient> eureka;
    private final ObjectProvider<ApplicationInfoManager> infoManager;
    private final ObjectProvider<AbstractDiscoveryClientOptionalArgs<?>> transportArgs;
    private final WireLog wire;
    private final AtomicLong cacheRefreshes = new AtomicLong();

    public JavaPeer(org.springframework.cloud.client.discovery.DiscoveryClient discovery,
            ObjectProvider<EurekaClient> eureka, ObjectProvider<ApplicationInfoManager> infoManager,
            ObjectProvider<AbstractDiscoveryClientOptionalArgs<?>> transportArgs, WireLog wire) {
        this.discovery = discovery;
        this.eureka = eureka;
        this.infoManager = infoManager;
        this.transportArgs = transportArgs;
        this.wire = wire;
    }

    public static void main(String[] args) {
        Spectator.globalRegistry().add(SPECTATOR);
        SpringApplication.run(JavaPeer.class, args);
    }

    /** CloudEurekaClient publishes one HeartbeatEvent per successful registry fetch. */
    @EventListener
    public void onCacheRefreshed(HeartbeatEvent event) {
        cacheRefreshes.incrementAndGet();
    }

    @GetMapping("/seen/{app}")
    public List<String> seen(@PathVariable String app) {
        return discovery.getInstances(app).stream().map(ServiceInstance::getInstanceId).toList();
    }

    @GetMapping("/seen-all/{app}")
    public List<Map<String, Object>> seenAll(@PathVariable String app) {
        List<Map<String, Object>> out = new ArrayList<>();
        Application application = eureka.getObject().getApplication(app);
        if (application == null) {
            return out;
        }
        // getInstancesAsIsFromEureka: getInstances() may return the shuffled copy, which
        // keeps only UP instances when eureka.client.filter-only-up-instances is true (default).
        for (InstanceInfo i : application.getInstancesAsIsFromEureka()) {
            out.add(describe(i));
        }
        return out;
    }

    @GetMapping("/stats")
    public Map<String, Object> stats() {
        Map<String, Object> out = new LinkedHashMap<>();
        InstanceInfo self = infoManager.getObject().getInfo();
        EurekaClient client = eureka.getObject();
        out.put("app", self.getAppName());
        out.put("instanceId", self.getId());
        out.put("countersValid", org.slf4j.LoggerFactory.getLogger(DiscoveryClient.class).isDebugEnabled());
        out.putAll(EurekaLogCounter.snapshot());
        out.put("cacheRefreshes", cacheRefreshes.get());
        out.put("spectator", spectator());
        out.put("http", wire.counts());
        AbstractDiscoveryClientOptionalArgs<?> args = transportArgs.getIfAvailable();
        out.put("transport", args == null ? null : args.getClass().getSimpleName());

        out.put("localStatus", String.valueOf(self.getStatus()));
        out.put("remoteStatus", String.valueOf(client.getInstanceRemoteStatus()));
        InstanceInfo remote = null;
        Application mine = client.getApplication(self.getAppName());
        if (mine != null) {
            remote = mine.getByInstanceId(self.getId());
        }
        out.put("remote", remote == null ? null : describe(remote));
        Applications apps = client.getApplications();
        out.put("localAppsVersion", apps == null ? null : apps.getVersion());
        out.put("localAppsHashCode", apps == null ? null : apps.getAppsHashCode());
        out.put("localReconcileHashCode", apps == null ? null : apps.getReconcileHashCode());
        Object target = ProxyUtils.getTargetObject(client);
        if (target instanceof DiscoveryClient dc) {
            out.put("lastSuccessfulHeartbeatAgoMs", dc.getLastSuccessfulHeartbeatTimePeriod());
            out.put("lastSuccessfulRegistryFetchAgoMs", dc.getLastSuccessfulRegistryFetchTimePeriod());
            out.put("localRegistrySize", dc.getStats().localRegistrySize());
        }
        return out;
    }

    @GetMapping("/wire")
    public List<Map<String, Object>> wire() {
        return wire.recent();
    }

    /** Sets this instance's own status; the client then re-sends its registration. */
    @PostMapping("/local-status/{status}")
    public ResponseEntity<String> localStatus(@PathVariable String status) {
        InstanceInfo.InstanceStatus s = InstanceInfo.InstanceStatus.toEnum(status);
        if (s == InstanceInfo.InstanceStatus.UNKNOWN && !"UNKNOWN".equalsIgnoreCase(status)) {
            return ResponseEntity.badRequest().body("unknown status " + status);
        }
        infoManager.getObject().setInstanceStatus(s);
        return ResponseEntity.ok(s.name());
    }

    private static Map<String, Object> describe(InstanceInfo i) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("id", i.getId());
        m.put("app", i.getAppName());
        m.put("status", String.valueOf(i.getStatus()));
        m.put("overriddenStatus", String.valueOf(i.getOverriddenStatus()));
        m.put("hostName", i.getHostName());
        m.put("ipAddr", i.getIPAddr());
        m.put("port", i.getPort());
        m.put("vipAddress", i.getVIPAddress());
        m.put("lastDirtyTimestamp", i.getLastDirtyTimestamp());
        m.put("lastUpdatedTimestamp", i.getLastUpdatedTimestamp());
        m.put("actionType", String.valueOf(i.getActionType()));
        m.put("metadata", i.getMetadata());
        return m;
    }

    /** DiscoveryClient's own Spectator meters (names from DiscoveryClient v2.0.4, l.129-131). */
    private static Map<String, Long> spectator() {
        Map<String, Long> m = new LinkedHashMap<>();
        m.put("reconcileHashCodeMismatch", counter("DiscoveryClient_ReconcileHashCodeMismatch"));
        m.put("reregister", counter("DiscoveryClient_Reregister"));
        m.put("fetchRegistryCalls", SPECTATOR.timers()
            .filter(t -> t.id().name().equals("DiscoveryClient_FetchRegistry"))
            .mapToLong(Timer::count).sum());
        return m;
    }

    private static long counter(String name) {
        return SPECTATOR.counters().filter(c -> c.id().name().equals(name)).mapToLong(Counter::count).sum();
    }
}
