# `cmake --install <build> [--prefix P]` (GNUInstallDirs, default prefix
# /usr/local), DESTDIR honoured:
#   P/bin/numaserve, P/bin/numaserve-dataset     the server; the training-data converter
#   P/lib/numaserve/                             civetweb's OpenSSL 3 libraries (HTTPS /metrics)
#   P/lib/systemd/system/numaserve.service       paths rewritten for P
#   P/share/numaserve/models/                    the default model repository
#   P/share/numaserve/prometheus/                scrape config, alert rules, their tests
#   P/share/numaserve/grafana/numaserve.json     the dashboard
#   P/share/doc/numaserve/                       README, docs/ (the reference),
#                                                numaserve.default (for
#                                                /etc/default/numaserve), the
#                                                cpus.conf.example drop-in
# tests/deploy/test_install.py checks the tree and verifies the installed unit.
include(GNUInstallDirs)

set(NUMASERVE_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
    "Where the systemd unit goes, relative to the install prefix (or absolute)")

set(numaserve_deploy ${PROJECT_SOURCE_DIR}/deploy)
set(numaserve_share ${CMAKE_INSTALL_DATADIR}/numaserve)
set(numaserve_doc ${CMAKE_INSTALL_DOCDIR})

# As built: install(TARGETS) would rewrite the RUNPATH that Open MPI's link
# directory adds (a system directory, harmless), and CMake's rewrite fails on
# the form the linker leaves it in.
install(PROGRAMS $<TARGET_FILE:numaserve> $<TARGET_FILE:numaserve-dataset>
        DESTINATION ${CMAKE_INSTALL_BINDIR})
# What Debian's civetweb needs for HTTPS on OpenSSL 3
# (serving/observability/civetweb_openssl3.c), where numaserve looks for it:
# ../lib/numaserve from its own directory, so lib/numaserve whatever the
# libdir (and the binary in bin/).
install(TARGETS numaserve_civetweb_crypto numaserve_civetweb_ssl
        LIBRARY DESTINATION lib/numaserve)

# The default repository: the trained model models/ serves (the build copies
# the same file to models/fashion_classifier/1/model.onnx).
install(FILES ${PROJECT_SOURCE_DIR}/models/fashion_classifier.trained.onnx
        DESTINATION ${numaserve_share}/models/fashion_classifier/1
        RENAME model.onnx)

install(FILES ${numaserve_deploy}/prometheus/prometheus.yml
              ${numaserve_deploy}/prometheus/numaserve-alerts.yml
              ${numaserve_deploy}/prometheus/alerts_test.yml
        DESTINATION ${numaserve_share}/prometheus)
install(FILES ${numaserve_deploy}/grafana/numaserve.json DESTINATION ${numaserve_share}/grafana)
install(FILES ${PROJECT_SOURCE_DIR}/README.md
              ${numaserve_deploy}/systemd/numaserve.service.d/cpus.conf.example
        DESTINATION ${numaserve_doc})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${numaserve_doc}/docs
        FILES_MATCHING PATTERN "*.md")

# The unit and the environment file name /usr/local paths (the default
# prefix); at install time they are rewritten for the prefix in force
# (`--prefix` may differ from the configured one), then installed.
set(numaserve_staged ${CMAKE_CURRENT_BINARY_DIR}/install-staging)
install(CODE "
  set(numaserve_prefix \"\${CMAKE_INSTALL_PREFIX}\")
  function(numaserve_full_dir out dir)
    if(IS_ABSOLUTE \"\${dir}\")
      set(\${out} \"\${dir}\" PARENT_SCOPE)
    else()
      set(\${out} \"\${numaserve_prefix}/\${dir}\" PARENT_SCOPE)
    endif()
  endfunction()
  numaserve_full_dir(bindir \"${CMAKE_INSTALL_BINDIR}\")
  numaserve_full_dir(sharedir \"${numaserve_share}\")
  numaserve_full_dir(docdir \"${numaserve_doc}\")
  foreach(pair \"systemd/numaserve.service;numaserve.service\"
               \"systemd/numaserve.default;numaserve.default\")
    list(GET pair 0 source)
    list(GET pair 1 name)
    file(READ \"${numaserve_deploy}/\${source}\" text)
    string(REPLACE \"/usr/local/bin/\" \"\${bindir}/\" text \"\${text}\")
    string(REPLACE \"/usr/local/share/numaserve/\" \"\${sharedir}/\" text \"\${text}\")
    string(REPLACE \"/usr/local/share/doc/numaserve/\" \"\${docdir}/\" text \"\${text}\")
    file(WRITE \"${numaserve_staged}/\${name}\" \"\${text}\")
  endforeach()
")
install(FILES ${numaserve_staged}/numaserve.service DESTINATION ${NUMASERVE_SYSTEMD_UNIT_DIR})
install(FILES ${numaserve_staged}/numaserve.default DESTINATION ${numaserve_doc})
