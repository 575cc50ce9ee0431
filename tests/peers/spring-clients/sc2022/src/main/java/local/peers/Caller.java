package local.peers;

import java.util.LinkedHashMap;
import java.util.Map;

import org.springframework.cloud.openfeign.EnableFeignClients;
import org.springframework.cloud.openfeign.FeignClient;
import org.springframework.context.annotation.Configuration;
import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.RestController;

/**
 * Calls the application named by {@code peer.target} by service name: OpenFeign, resolved by
 * Spring Cloud LoadBalancer from the Eureka client's registry copy. {@code GET /call} answers
 * {@code {"ok": true, "body": ...}} with what the callee said, or {@code {"ok": false, "error": ...}}.
 */
@RestController
@Configuration
@EnableFeignClients
public class Caller {

    @FeignClient(name = "${peer.target:greeter}")
    public interface Target {
        @GetMapping("/hello")
        String hello();
    }

    private final Target target;

    public Caller(Target target) {
        this.target = target;
    }

    @GetMapping("/call")
    public Map<String, Object> call() {
        Map<String, Object> out = new LinkedHashMap<>();
        try {
            out.put("body", target.hello());
            out.put("ok", true);
        } catch (RuntimeException e) {
            out.put("ok", false);
            out.put("error", String.valueOf(e));
        }
        return out;
    }
}
