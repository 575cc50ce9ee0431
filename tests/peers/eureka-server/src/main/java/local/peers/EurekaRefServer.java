package local.peers;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.cloud.netflix.eureka.server.EnableEurekaServer;

/**
 * Reference Eureka server for the Rust tests: the stock Spring Cloud Netflix server with
 * nothing added. All tuning (addresses, timers, peers) comes from command-line properties.
 */
@SpringBootApplication
@EnableEurekaServer
public class EurekaRefServer {
    public static void main(String[] args) {
        SpringApplication.run(EurekaRefServer.class, args);
    }
}
