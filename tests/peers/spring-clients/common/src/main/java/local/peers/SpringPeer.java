package local.peers;

import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;

import com.netflix.appinfo.ApplicationInfoManager;
import com.netflix.appinfo.InstanceInfo;
import com.netflix.discovery.DiscoveryClient;
import com.netflix.discovery.EurekaClient;
import com.netflix.discovery.shared.Application;

import org.springframework.aop.framework.Advised;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.cloud.client.discovery.event.HeartbeatEvent;
import org.springframework.context.event.EventListener;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.PathVariable;
import org.springframework.web.bind.annotation.RestController;

/**
 * A Spring Cloud Netflix Eureka client app as any Spring service is (the starter, a name, a
 * defaultZone), for every Spring generation the tests run; its build (../hoxton, ../sc2022) picks
 * the versions. Read-only JSON endpoints for the tests:
 * <ul>
 * <li>{@code GET /stats}: fetch, heartbeat and registration counters from the client's log events
 * ({@link EurekaEvents}) and its own reconcile hash-code mismatch counter;</li>
 * <li>{@code GET /seen-all/{app}}: every instance of the app in the client's local copy, any status.</li>
 * </ul>
 * Written for Java 11 so the Hoxton build (Boot 2.3) compiles it too.
 */
@SpringBootApplication
@RestController
public class SpringPeer {

    private final ObjectProvider<EurekaClient> eureka;
    private final ObjectProvider<ApplicationInfoManager> info;
    private final AtomicLong cacheRefreshes = new AtomicLong();

    public SpringPeer(ObjectProvider<EurekaClient> eureka, ObjectProvider<ApplicationInfoManager> info) {
        this.eureka = eureka;
        this.info = info;
    }

    public static void main(String[] args) {
        SpringApplication.run(SpringPeer.class, args);
    }

    /** CloudEurekaClient publishes one HeartbeatEvent per successful registry fetch. */
    @EventListener
    public void onCacheRefreshed(HeartbeatEvent event) {
        cacheRefreshes.incrementAndGet();
    }

    @GetMapping("/seen-all/{app}")
    public List<Map<String, Object>> seenAll(@PathVariable String app) {
        List<Map<String, Object>> out = new ArrayList<>();
        Application application = eureka.getObject().getApplication(app);
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

    @GetMapping("/stats")
    public Map<String, Object> stats() throws Exception {
        EurekaClient client = eureka.getObject();
        Object target = client instanceof Advised ? ((Advised) client).getTargetSource().getTarget() : client;
        InstanceInfo self = info.getObject().getInfo();
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("app", self.getAppName());
        out.put("instanceId", self.getId());
        out.put("eurekaClient", DiscoveryClient.class.getPackage().getImplementationVersion());
        out.put("countersValid", org.slf4j.LoggerFactory.getLogger(DiscoveryClient.class).isDebugEnabled());
        out.putAll(EurekaEvents.snapshot());
        out.put("reconcileMismatches", counter(target, "RECONCILE_HASH_CODES_MISMATCH"));
        out.put("reregistrations", counter(target, "REREGISTER_COUNTER"));
        out.put("cacheRefreshes", cacheRefreshes.get());
        out.put("localStatus", String.valueOf(self.getStatus()));
        out.put("remoteStatus", String.valueOf(client.getInstanceRemoteStatus()));
        out.put("localAppsHashCode", client.getApplications().getAppsHashCode());
        return out;
    }

    /**
     * One of DiscoveryClient's own per-instance counters: a Servo counter in 1.x ({@code getValue()}),
     * a Spectator counter in 2.x ({@code count()}); -1 when it cannot be read.
     */
    private static long counter(Object client, String field) {
        if (!(client instanceof DiscoveryClient)) {
            return -1;
        }
        try {
            Field f = DiscoveryClient.class.getDeclaredField(field);
            f.setAccessible(true);
            Object counter = f.get(client);
            for (String name : new String[] {"getValue", "count"}) {
                try {
                    Method m = counter.getClass().getMethod(name);
                    m.setAccessible(true);
                    return ((Number) m.invoke(counter)).longValue();
                } catch (NoSuchMethodException e) {
                    // try the other generation's accessor
                }
            }
        } catch (ReflectiveOperationException | RuntimeException e) {
            return -1;
        }
        return -1;
    }
}
