module eureka-operator.dev/tests/peers/kubelet/hello

go 1.26.0
