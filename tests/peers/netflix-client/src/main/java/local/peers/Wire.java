package local.peers;

import java.net.URI;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.TreeMap;

import com.sun.jersey.api.client.ClientHandlerException;
import com.sun.jersey.api.client.ClientRequest;
import com.sun.jersey.api.client.ClientResponse;
import com.sun.jersey.api.client.filter.ClientFilter;

/**
 * A Jersey 1 filter on one DiscoveryClient's transport: counts the Eureka requests it sends by
 * kind and HTTP status and, in XML mode, switches the request and the expected answer from the
 * transport's hard-coded JSON to XML, so Netflix's XStream codec does the encoding and decoding.
 */
final class Wire extends ClientFilter {

    private final boolean xml;
    private final Map<String, Long> counts = new TreeMap<>();
    private volatile String lastFetchType;

    Wire(boolean xml) {
        this.xml = xml;
    }

    @Override
    public ClientResponse handle(ClientRequest request) throws ClientHandlerException {
        if (xml) {
            request.getHeaders().putSingle("Accept", "application/xml");
            if (request.getEntity() != null) {
                request.getHeaders().putSingle("Content-Type", "application/xml");
            }
        }
        String kind = classify(request.getMethod(), request.getURI());
        int status = -1;
        try {
            ClientResponse response = getNext().handle(request);
            status = response.getStatus();
            if (kind.endsWith("Fetch") && response.getType() != null) {
                lastFetchType = response.getType().toString();
            }
            return response;
        } finally {
            synchronized (counts) {
                counts.merge(kind, 1L, Long::sum);
                counts.merge(kind + "." + status, 1L, Long::sum);
            }
        }
    }

    /** `fullFetch`, `deltaFetch`, `register`, `heartbeat`, `cancel`, `statusUpdate` or `other`. */
    static String classify(String method, URI uri) {
        String path = uri.getPath() == null ? "" : uri.getPath();
        int at = path.lastIndexOf("/apps");
        if (at < 0) {
            return "other";
        }
        String rest = path.substring(at + "/apps".length()).replaceAll("^/+|/+$", "");
        String[] seg = rest.isEmpty() ? new String[0] : rest.split("/");
        switch (method) {
            case "GET":
                return seg.length == 0 ? "fullFetch" : seg.length == 1 && seg[0].equals("delta") ? "deltaFetch" : "other";
            case "POST":
                return seg.length == 1 ? "register" : "other";
            case "PUT":
                return seg.length == 2 ? "heartbeat" : seg.length == 3 ? "statusUpdate" : "other";
            case "DELETE":
                return seg.length == 2 ? "cancel" : "other";
            default:
                return "other";
        }
    }

    long count(String key) {
        synchronized (counts) {
            return counts.getOrDefault(key, 0L);
        }
    }

    /** The Content-Type of the last registry fetch's answer. */
    String lastFetchType() {
        return lastFetchType;
    }

    Map<String, Long> snapshot() {
        synchronized (counts) {
            return new LinkedHashMap<>(counts);
        }
    }
}
