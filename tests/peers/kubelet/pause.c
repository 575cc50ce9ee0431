/* The pod sandbox's process for the real-node tests: it holds the pod's namespaces and does
 * nothing else. Built static (gcc -static) into an image FROM scratch, imported into containerd
 * under the name its CRI plugin's `sandbox_image` gives, since no registry can be reached. It
 * exits on SIGINT and SIGTERM and reaps any child it inherits as PID 1. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &on_stop, NULL);
    sigaction(SIGTERM, &on_stop, NULL);
    sigaction(SIGCHLD, &on_child, NULL);
    for (;;) {
        pause();
    }
    return EXIT_SUCCESS;
}
