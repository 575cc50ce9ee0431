package local.peers;

import java.io.IOException;
import java.net.URI;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import org.springframework.boot.web.client.RestClientCustomizer;
import org.springframework.boot.web.client.RestTemplateCustomizer;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.http.HttpRequest;
import org.springframework.http.client.ClientHttpRequestExecution;
import org.springframework.http.client.ClientHttpRequestInterceptor;
import org.springframework.http.client.ClientHttpResponse;

/**
 * Records what the Eureka client actually sends. Spring Cloud Netflix 4.3 builds its
 * RestTemplate from Boot's RestTemplateBuilder (RestTemplateTransportClientFactory) and its
 * RestClient from Boot's RestClient.Builder (RestClientTransportClientFactory), so a customizer
 * for each puts this interceptor on whichever transport is active. This peer makes no other
 * outgoing HTTP calls, so everything recorded here is Eureka traffic.
 */
@Configuration(proxyBeanMethods = false)
public class WireLog implements ClientHttpRequestInterceptor {

    private static final int KEEP = 500;

    private final Map<String, AtomicLong> counts = new ConcurrentHashMap<>();
    private final Deque<Map<String, Object>> recent = new ArrayDeque<>();

    @Bean
    RestTemplateCustomizer wireLogRestTemplate() {
        return rt -> rt.getInterceptors().add(this);
    }

    @Bean
    RestClientCustomizer wireLogRestClient() {
        return b -> b.requestInterceptor(this);
    }

    @Override
    public ClientHttpResponse intercept(HttpRequest request, byte[] body, ClientHttpRequestExecution execution)
            throws IOException {
        String kind = classify(request.getMethod().name(), request.getURI());
        int status = -1;
        try {
            ClientHttpResponse response = execution.execute(request, body);
            status = response.getStatusCode().value();
            return response;
        } finally {
            counts.computeIfAbsent(kind, k -> new AtomicLong()).incrementAndGet();
            if (status != 200 && status != 204) {
                counts.computeIfAbsent(kind + "." + status, k -> new AtomicLong()).incrementAndGet();
            }
            Map<String, Object> entry = new LinkedHashMap<>();
            entry.put("t", System.currentTimeMillis());
            entry.put("kind", kind);
            entry.put("method", request.getMethod().name());
            entry.put("uri", request.getURI().toString());
            entry.put("status", status);
            synchronized (recent) {
                recent.addLast(entry);
                while (recent.size() > KEEP) {
                    recent.removeFirst();
                }
            }
        }
    }

    /** Names the Eureka operation from the method and the path after ".../apps". */
    static String classify(String method, URI uri) {
        String path = uri.getPath() == null ? "" : uri.getPath();
        int at = path.lastIndexOf("/apps");
        if (at < 0) {
            return "other";
        }
        String rest = path.substring(at + "/apps".length());
        if (rest.startsWith("/")) {
            rest = rest.substring(1);
        }
        if (rest.endsWith("/")) {
            rest = rest.substring(0, rest.length() - 1);
        }
        String[] seg = rest.isEmpty() ? new String[0] : rest.split("/");
        switch (method) {
            case "GET":
                if (seg.length == 0) {
                    return "fullFetch";
                }
                if (seg.length == 1 && seg[0].equals("delta")) {
                    return "deltaFetch";
                }
                return "get";
            case "POST":
                return seg.length == 1 ? "register" : "other";
            case "PUT":
                if (seg.length == 2) {
                    return "heartbeat";
                }
                return seg.length == 3 && seg[2].equals("status") ? "statusUpdate" : "other";
            case "DELETE":
                if (seg.length == 2) {
                    return "cancel";
                }
                return seg.length == 3 && seg[2].equals("status") ? "deleteStatusOverride" : "other";
            default:
                return "other";
        }
    }

    Map<String, Long> counts() {
        Map<String, Long> out = new LinkedHashMap<>();
        for (String k : new String[] {"fullFetch", "deltaFetch", "register", "heartbeat", "cancel", "statusUpdate"}) {
            out.put(k, 0L);
        }
        counts.entrySet().stream().sorted(Map.Entry.comparingByKey())
            .forEach(e -> out.put(e.getKey(), e.getValue().get()));
        return out;
    }

    List<Map<String, Object>> recent() {
        synchronized (recent) {
            return new ArrayList<>(recent);
        }
    }
}
